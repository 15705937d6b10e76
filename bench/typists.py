"""`python -m bench.typists`: N typists on one engine in this process (no gateway, no Ray).

`bench serve`'s workload without the serving stack, for machines that have
the engine's dependencies but not Ray Serve (the GPU check,
`scripts/gpu_check.sh`, runs it on the device machine). For each N, N
typists start together, each replaying a seeded `Typist` trace of a Spider
question in real time, in two modes that alternate round by round:

- **anticipatory**: every keystroke goes to the typist's own session (the
  headstart policy); Enter submits on the session;
- **prefix**: nothing is sent while typing; Enter starts a prefix-mode
  completion (the schema's P0 cached, the question prefilled at submit: what
  prefix caching gives).

TTFT and the complete answer are the engine's clocks (`SubmitResult`: from
the submit); "decode ms / token" is (complete - TTFT) / (tokens - 1) of each
answer. Writes typists.json, typists.md and typists.png to --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import markdown_table, percentile, spider_questions, write_json

MODES = ("anticipatory", "prefix")


def _typist(runtime, db: str, trace, anticipate: bool, max_new_tokens: int) -> dict:
    """One typist's question: typed (and streamed when `anticipate`), submitted at Enter."""
    from headstart.engine.requests.generation import SamplingParams
    from headstart.replay import replay_trace

    params = SamplingParams(max_new_tokens=max_new_tokens)
    if anticipate:
        session = runtime.open_session(db, "headstart")
        try:
            result = replay_trace(session, trace, params)
        finally:
            runtime.close_session(session.session_id)
    else:
        time.sleep(trace.submit_t)
        result = runtime.start_complete(db, trace.final_text, "prefix", params).result()
    tokens = len(result.token_ids)
    return {"ttft_ms": result.ttft_ms, "total_ms": result.total_ms, "tokens": tokens, "text": result.text,
            "decode_ms_per_token": (result.total_ms - result.ttft_ms) / (tokens - 1) if tokens > 1 else None}


def run_round(runtime, db: str, questions: list[str], n: int, anticipate: bool, wpm: float, pause_s: float,
              max_new_tokens: int, seed: int) -> list[dict]:
    """N typists at once (threads), each on question i mod len(questions)."""
    from headstart.typist import Typist

    traces = [Typist(wpm=wpm, pause_s=pause_s, seed=seed + i).trace(questions[i % len(questions)]) for i in range(n)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda i: _typist(runtime, db, traces[i], anticipate, max_new_tokens), range(n)))


def summarize(samples: list[dict]) -> dict:
    ttft = [s["ttft_ms"] for s in samples]
    total = [s["total_ms"] for s in samples]
    per_token = [s["decode_ms_per_token"] for s in samples if s["decode_ms_per_token"] is not None]
    return {"n": len(samples), "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "total_p50_ms": percentile(total, 50), "tokens_p50": statistics.median(s["tokens"] for s in samples),
            "decode_ms_per_token_p50": statistics.median(per_token) if per_token else None}


def run_typists_bench(out: Path, model: str, dtype: str, device: str, typists: tuple[int, ...], rounds: int,
                      wpm: float, pause_s: float, max_new_tokens: int, db: str, seed: int,
                      threads: int | None = None) -> dict:
    from headstart.build import build_runtime

    if not typists or min(typists) < 1 or rounds < 1:
        raise ValueError("need typists >= 1 and rounds >= 1")
    runtime = build_runtime(model=model, dtype=dtype, device=device, threads=threads, p0_cache_on_disk=False,
                            max_sessions=max(64, 2 * max(typists)))
    print(f"{runtime.loaded.model_id} on {device} ({dtype}); fast path: {runtime.fast_path_choice.summary()}",
          flush=True)
    try:
        runtime.base_state(runtime.prompt_for(db))  # the schema resolved and P0 warm before any clock
        runtime.complete(db, "warm up", "prefix", 2)
        questions = [q["question"] for q in spider_questions([db], max(typists), seed)]
        samples: dict[tuple[int, str], list[dict]] = {}
        for n in typists:
            for r in range(rounds):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    got = run_round(runtime, db, questions, n, mode == "anticipatory", wpm, pause_s, max_new_tokens,
                                    seed + 1000 * r)
                    samples.setdefault((n, mode), []).extend(got)
                    print(f"  N={n} round {r} {mode}: TTFT p50 {summarize(got)['ttft_p50_ms']:.1f} ms", flush=True)
    finally:
        runtime.shutdown()
    rows = [{"typists": n, "mode": mode, **summarize(samples[(n, mode)])} for n in typists for mode in MODES]
    for row in rows:
        prefix = next(r for r in rows if r["typists"] == row["typists"] and r["mode"] == "prefix")
        row["total_vs_prefix"] = row["total_p50_ms"] / prefix["total_p50_ms"] if prefix["total_p50_ms"] else None
    report = {"config": {"model": model, "dtype": dtype, "device": device, "typists": list(typists), "rounds": rounds,
                         "wpm": wpm, "pause_s": pause_s, "max_new_tokens": max_new_tokens, "db": db, "seed": seed},
              "rows": rows, "samples": {f"{n}:{mode}": s for (n, mode), s in samples.items()}}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "typists.json", report)
    text = table(rows)
    (out / "typists.md").write_text(text + "\n")
    print(text)
    plot(rows, out / "typists.png")
    return report


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(rows: list[dict]) -> str:
    header = ["typists", "mode", "answers", "TTFT p50 ms", "TTFT p99 ms", "complete p50 ms", "complete / prefix",
              "decode ms / token p50", "answer tokens p50"]
    return markdown_table(header, [[r["typists"], r["mode"], r["n"], _ms(r["ttft_p50_ms"]), _ms(r["ttft_p99_ms"]),
                                    _ms(r["total_p50_ms"]),
                                    "-" if r["total_vs_prefix"] is None else f"{r['total_vs_prefix']:.2f}",
                                    _ms(r["decode_ms_per_token_p50"]), f"{r['tokens_p50']:g}"] for r in rows])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        ns = [r["typists"] for r in mine]
        axes[0].plot(ns, [r["ttft_p50_ms"] for r in mine], marker="o", label=mode)
        axes[1].plot(ns, [r["total_p50_ms"] for r in mine], marker="o", label=mode)
    for ax, title in zip(axes, ("TTFT p50 (ms)", "complete answer p50 (ms)")):
        ax.set_xlabel("typists")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the engine's)")
    ap.add_argument("--typists", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per N; the modes alternate round by round")
    ap.add_argument("--wpm", type=float, default=60.0)
    ap.add_argument("--pause", type=float, default=0.3, help="seconds between the last keystroke interval and Enter")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--db", default="world_1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench-out/typists"))
    args = ap.parse_args(argv)
    try:
        run_typists_bench(args.out, args.model, args.dtype, args.device, tuple(args.typists), args.rounds, args.wpm,
                          args.pause, args.max_new_tokens, args.db, args.seed, args.threads)
    except ValueError as exc:
        ap.error(str(exc))


if __name__ == "__main__":
    main()
