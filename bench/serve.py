"""`headstart bench serve`: simulated typists against the local stack.

For each concurrency N and each client path (WebSocket, gRPC), N typists type
world_1 questions from Spider dev at human speed and press Enter; the same is
repeated without anticipation (nothing sent while typing: the prefix-caching
baseline). With a llama.cpp server available (the C++ `llama-server`, with
`-np N` at each N, when built; else llama-cpp-python's), llamacpp rows too:
the same typists asking llama.cpp on the same weights through its OpenAI API
(`bench/serve_llamacpp.py`). Reported per (mode, path, N): client TTFT
p50/p99, engine TTFT, the time to the last token (p50/p99, client side),
both as ratios to llamacpp's at the same N, tokens computed at submit, and
the per-keystroke gateway→replica round trip (from the gateway's snapshot
acks). With `candidates` K > 1 every typist of ours asks for the checked
answer (its session decodes the candidates during the pauses) and each row
adds the time to it (`checked_client_total_p50_ms` / `_p99_ms`: submit sent
→ `choice` received, beside the greedy answer's client total) and how often
the check kept another SQL (`checked_changed_share`); `candidates_wait_all` makes
every choice wait for all K (the cost of the samples then shows in the others'
keystroke round trips and TTFT). Writes serve.json, serve.md and serve.png
to `out_dir`. A benchmark, not a test: it never fails on a timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

from bench.common import percentile as common_percentile
from bench.common import spider_questions
from bench.peer_llamacpp import start_peer
from bench.serve_typists import Sample, grpc_typist, ws_typist
from headstart.config import MAX_ANSWER_TOKENS, EngineSettings
from headstart.models.catalogue import DEFAULT_MODEL
from headstart.models.loader import CPU_BLAS_ENV
from headstart.typist import Typist

PATHS = ("ws", "grpc")


def percentile(values: list[float], q: float) -> float | None:
    return common_percentile(values, q) if values else None


def summarize(samples: list[Sample], rtts: list[float]) -> dict:
    ok = [s for s in samples if not s.error]
    ttft = [s.ttft_ms for s in ok]
    computed = [s.computed_tokens_at_submit for s in ok if s.computed_tokens_at_submit is not None]
    return {
        "num_samples": len(samples), "num_errors": len(samples) - len(ok),
        "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
        "engine_ttft_p50_ms": percentile([s.engine_ttft_ms for s in ok if s.engine_ttft_ms is not None], 50),
        # submit -> last token (engine side): what deferring decode steps behind typing costs
        "total_p50_ms": percentile([s.total_ms for s in ok], 50),
        # submit sent -> last token received, at the client: the one total every engine is measured by
        "client_total_p50_ms": percentile([s.client_total_ms for s in ok if s.client_total_ms is not None], 50),
        "client_total_p99_ms": percentile([s.client_total_ms for s in ok if s.client_total_ms is not None], 99),
        "computed_at_submit_mean": statistics.fmean(computed) if computed else None,
        "answer_tokens_at_submit_mean": statistics.fmean(ahead) if (ahead := [
            s.answer_tokens_at_submit for s in ok if s.answer_tokens_at_submit is not None]) else None,
        "keystroke_rtt_p50_ms": percentile([r * 1000 for r in rtts], 50),
        "keystroke_rtt_p99_ms": percentile([r * 1000 for r in rtts], 99),
        "answer_tokens_p50": percentile([s.answer_tokens for s in ok if s.answer_tokens is not None], 50),
        **_checked_summary(ok),
    }


def _checked_summary(ok: list[Sample]) -> dict:
    """The checked answers' figures (none without candidates): time to the choice, how often it changed."""
    checked = [s for s in ok if s.checked_client_total_ms is not None]
    if not checked:
        return {}
    return {"checked_client_total_p50_ms": percentile([s.checked_client_total_ms for s in checked], 50),
            "checked_client_total_p99_ms": percentile([s.checked_client_total_ms for s in checked], 99),
            "checked_num_candidates_mean": statistics.fmean(s.checked_num_candidates for s in checked),
            "checked_changed_share": sum(bool(s.checked_changed) for s in checked) / len(checked)}


def output_agreement(samples: list[dict]) -> dict:
    """Whether each question got one answer text in every mode and path of ours (anticipatory and
    prefix, WebSocket and gRPC, every N): the exactness promise under load and batching. llama.cpp's
    answers are its own arithmetic and are not counted."""
    texts: dict[str, set[str]] = {}
    for s in samples:
        if s["anticipate"] in (True, False) and s["path"] in PATHS and not s["error"]:
            texts.setdefault(s["question"], set()).add(s["text"])
    differing = sorted(q for q, seen in texts.items() if len(seen) > 1)
    return {"questions": len(texts), "identical": len(texts) - len(differing), "differing": differing}


async def _round(stack, path: str, anticipate: bool, n: int, questions: list[str], r: int, rounds: int, db: str,
                 typist: Typist, max_new: int, token: str | None, candidates: int = 1,
                 wait_all: bool = False) -> list[Sample]:
    """Round `r`: N typists each type one question (typist i: question i*rounds + r) and press Enter."""
    async def one(i: int) -> Sample:
        trace = typist.trace(questions[(i * rounds + r) % len(questions)])
        if path == "ws":
            return await ws_typist(stack.http_url.replace("http", "ws", 1), token, db, trace, anticipate, max_new,
                                   candidates, wait_all)
        return await grpc_typist(stack.grpc_target, token, db, trace, anticipate, max_new, candidates, wait_all)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _all_rounds(stack, concurrency, questions, rounds, db, typist, max_new_tokens, say, peer=None,
                      candidates: int = 1, wait_all: bool = False):
    """Rounds of the two modes alternate (anticipatory, prefix, prefix,
    anticipatory, ...), so a machine whose speed drifts during the run (a
    shared CPU does) weighs on both sides of each ratio alike. `peer`
    (`PeerRows`): a llamacpp round follows each round."""
    from bench.serve_llamacpp import llamacpp_round

    metrics = stack.gateway.service.metrics
    rows, samples = [], []
    for n in concurrency:
        got: dict[tuple[bool, str], list[Sample]] = {}
        rtts: dict[tuple[bool, str], list[float]] = {}
        wall: dict[tuple[bool, str], float] = {}
        server = peer.at(n) if peer else None  # llama-server restarted with -np N
        for r in range(rounds):
            # llama-server stopped while our rounds run: idle, its threads still poll the same cores
            with server.paused() if server else contextlib.nullcontext():
                for path in PATHS:
                    for anticipate in ((True, False) if r % 2 == 0 else (False, True)):
                        key = (anticipate, path)
                        metrics.rtt_samples.clear()
                        started = time.perf_counter()
                        got.setdefault(key, []).extend(await _round(stack, path, anticipate, n, questions, r, rounds,
                                                                    db, typist, max_new_tokens, None, candidates,
                                                                    wait_all))
                        wall[key] = wall.get(key, 0.0) + time.perf_counter() - started
                        rtts.setdefault(key, []).extend(metrics.rtt_samples)
            if peer:
                key = ("llamacpp", "openai")
                started = time.perf_counter()
                got.setdefault(key, []).extend(await llamacpp_round(server, peer.builder, n, questions, r, rounds,
                                                                    typist, max_new_tokens))
                wall[key] = wall.get(key, 0.0) + time.perf_counter() - started
                rtts[key] = []
        for key in [(a, p) for a in (True, False) for p in PATHS] + ([("llamacpp", "openai")] if peer else []):
            anticipate, path = key
            mode = anticipate if isinstance(anticipate, str) else "anticipatory" if anticipate else "prefix"
            row = {"mode": mode, "path": path, "n": n, "wall_s": wall[key], **summarize(got[key], rtts[key])}
            if mode == "llamacpp":
                row["server"] = server.describe()
            rows.append(row)
            samples += [dict(s.as_dict(), n=n) for s in got[key]]
            say(_format_row(row))
    return rows, samples


def run_serve_bench(out_dir: str | Path, model: str = DEFAULT_MODEL, dtype: str = "float32",
                    device: str = "cpu", replicas: int = 1, concurrency: tuple[int, ...] = (1, 2, 4),
                    rounds: int = 3, wpm: float = 60.0, pause_s: float = 0.3, max_new_tokens: int = MAX_ANSWER_TOKENS,
                    db: str = "world_1", seed: int = 0, say=print, llamacpp: str = "auto",
                    llamacpp_server: str = "auto", candidates: int = 1, candidates_wait_all: bool = False) -> dict:
    """Run the benchmark on a local stack it starts and stops; returns the JSON it writes.
    `llamacpp` (auto|on|off) and `llamacpp_server` (auto|cpp|python): the llama.cpp rows.
    `candidates` > 1: our typists ask for the checked answer (its time: the `checked_*` fields);
    `candidates_wait_all`: the choice among all K (else among those ready when the greedy answer ends)."""
    from services.launcher import default_replica_threads, serve_command

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    questions = [q["question"] for q in spider_questions([db], 40, seed)]
    typist = Typist(wpm=wpm, pause_s=pause_s, seed=seed)
    # llama.cpp gets the threads one replica gets (f32, the same weights); None when not available.
    server = start_peer(model, llamacpp, default_replica_threads(device, replicas), say=say, server=llamacpp_server,
                        parallel=concurrency[0]) if dtype == "float32" else None
    stack = peer = None
    try:
        stack = serve_command(model=model, dtype=dtype, device=device, replicas=replicas, port=0, grpc_port=0,
                              block=False, say=say)
        _warm_up(stack, db, say)
        if server:
            from bench.serve_llamacpp import PeerRows, prompt_builder

            peer = PeerRows(server, prompt_builder(db), say=say)
        # NOTE: one event loop for every round: grpc.aio binds to the first loop it runs on.
        rows, samples = asyncio.run(_all_rounds(stack, concurrency, questions, rounds, db, typist,
                                                max_new_tokens, say, peer, candidates, candidates_wait_all))
    finally:
        if stack:
            stack.stop()
        if peer:
            peer.stop()
        if server:
            server.stop()
    engine = EngineSettings()  # the replicas' scheduler settings (from HEADSTART_* like theirs)
    blas = {name: os.environ.get(name, value) for name, value in CPU_BLAS_ENV.items()}  # as the replicas' loader sets it
    report = {"config": {"model": model, "dtype": dtype, "device": device, "replicas": replicas,
                         "threads_per_replica": default_replica_threads(device, replicas),
                         "decode_defer_ms": engine.decode_defer_ms, "batch_scope": engine.batch_scope,
                         "max_batch_rows": engine.max_batch_rows, "cpu_blas_env": blas if device == "cpu" else {},
                         "concurrency": list(concurrency), "rounds": rounds, "wpm": wpm, "pause_s": pause_s,
                         "max_new_tokens": max_new_tokens, "db": db, "candidates": candidates,
                         "candidates_wait_all": candidates_wait_all,
                         "llamacpp": None if server is None else {
                             "gguf": server.gguf.name, "threads": server.threads, "server": server.kind,
                             "parallel": "N at each N" if server.kind == "cpp" else 1}},
              "rows": rows, "outputs": output_agreement(samples), "samples": samples}
    text = table(rows) + _agreement_line(report["outputs"])
    (out_dir / "serve.json").write_text(json.dumps(report, indent=2))
    (out_dir / "serve.md").write_text(text)
    plot(rows, out_dir / "serve.png")
    say(text)
    return report


def _agreement_line(outputs: dict) -> str:
    line = (f"\nOutputs: {outputs['identical']} of {outputs['questions']} questions got the same answer text in "
            "every mode, path and N of ours")
    return line + (f"; differing: {outputs['differing']}\n" if outputs["differing"] else "\n")


def _warm_up(stack, db: str, say) -> None:
    """One completion so P0 is prefilled and cached before anything is timed."""
    from headstart.client import HeadstartClient

    with HeadstartClient(stack.grpc_target, timeout_s=600) as client:
        client.complete(db, "warm up", 1)
    say("warm-up done")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _format_row(row: dict) -> str:
    return (f"{row['mode']:>12} {row['path']:>4} N={row['n']:<3} TTFT p50 {_fmt(row['ttft_p50_ms'])} ms "
            f"p99 {_fmt(row['ttft_p99_ms'])} ms, computed@submit {_fmt(row['computed_at_submit_mean'])}, "
            f"keystroke rtt p50 {_fmt(row['keystroke_rtt_p50_ms'])} ms, errors {row['num_errors']}"
            + (f", checked p50 {_fmt(row['checked_client_total_p50_ms'])} ms"
               if row.get("checked_client_total_p50_ms") is not None else ""))


def _ratio(row: dict, rows: list[dict], stat: str) -> str:
    """`row[stat]` over the llamacpp row's at the same N (< 1: faster than llama.cpp); '-' without one."""
    peer = next((p for p in rows if p["mode"] == "llamacpp" and p["n"] == row["n"]), None)
    if peer is None or row.get(stat) is None or not peer.get(stat):
        return "-"
    return f"{row[stat] / peer[stat]:.2f}"


def _vs_prefix(row: dict, rows: list[dict]) -> str:
    """The anticipatory row's client total p50 over prefix caching's on the
    same path and N (issue 11's bar: <= 1.0); '-' for other rows."""
    peer = next((p for p in rows if p["mode"] == "prefix" and p["n"] == row["n"] and p["path"] == row["path"]
                 and not p.get("server")), None)
    if row["mode"] != "anticipatory" or peer is None or not row.get("client_total_p50_ms") \
            or not peer.get("client_total_p50_ms"):
        return "-"
    return f"{row['client_total_p50_ms'] / peer['client_total_p50_ms']:.2f}"


def table(rows: list[dict]) -> str:
    return _main_table(rows) + _checked_table(rows)


def _checked_table(rows: list[dict]) -> str:
    """The checked answers' columns, beside the greedy answer's client total (empty without candidates)."""
    checked = [r for r in rows if r.get("checked_client_total_p50_ms") is not None]
    if not checked:
        return ""
    head = ("\n| mode | path | N | greedy client total p50 ms | checked p50 ms | checked p99 ms | "
            "candidates checked (mean) | changed by the check |\n|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['mode']} | {r['path']} | {r['n']} | {_fmt(r.get('client_total_p50_ms'))} | "
        f"{_fmt(r['checked_client_total_p50_ms'])} | {_fmt(r['checked_client_total_p99_ms'])} | "
        f"{r['checked_num_candidates_mean']:.1f} | {100 * r['checked_changed_share']:.0f}% |\n" for r in checked)


def _main_table(rows: list[dict]) -> str:
    head = ("| mode | path | N | TTFT p50 ms | TTFT p99 ms | engine TTFT p50 ms | total p50 ms | client total p50 ms | "
            "client total p99 ms | client total p50 / prefix | TTFT p50 / llamacpp | client total p50 / llamacpp | "
            "computed@submit | answer tokens@submit | answer tokens p50 | keystroke RTT p50 ms | keystroke RTT p99 ms | "
            "errors |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['mode']}{f' ({s})' if (s := r.get('server')) else ''} | {r['path']} | {r['n']} | "
        f"{_fmt(r['ttft_p50_ms'])} | {_fmt(r['ttft_p99_ms'])} | "
        f"{_fmt(r['engine_ttft_p50_ms'])} | {_fmt(r.get('total_p50_ms'))} | {_fmt(r.get('client_total_p50_ms'))} | "
        f"{_fmt(r.get('client_total_p99_ms'))} | {_vs_prefix(r, rows)} | {_ratio(r, rows, 'ttft_p50_ms')} | "
        f"{_ratio(r, rows, 'client_total_p50_ms')} | {_fmt(r['computed_at_submit_mean'])} | "
        f"{_fmt(r.get('answer_tokens_at_submit_mean'))} | {_fmt(r.get('answer_tokens_p50'))} | "
        f"{_fmt(r['keystroke_rtt_p50_ms'])} | {_fmt(r['keystroke_rtt_p99_ms'])} | {r['num_errors']} |\n"
        for r in rows)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, stat in zip(axes, ("ttft_p50_ms", "ttft_p99_ms")):
        for mode, style in (("anticipatory", "-o"), ("prefix", "--s"), ("llamacpp", ":^")):
            for p in PATHS + ("openai",):
                pts = sorted((r["n"], r[stat]) for r in rows if r["mode"] == mode and r["path"] == p and r[stat])
                if pts:
                    ax.plot(*zip(*pts), style, label=f"{mode} / {p}")
        ax.set_title(stat.replace("_", " "))
        ax.set_xlabel("concurrent typists")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("client TTFT (ms)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
