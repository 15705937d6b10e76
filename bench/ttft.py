"""`headstart bench ttft`: the APITS paper's Table III, side by side in one run.

Same questions, same seeded synthetic typist, real time, one process:
- cold: no cache, the whole prompt is prefilled at Enter;
- prefix: P0 warm (what vLLM prefix caching / SGLang's radix cache give), the
  question prefilled at Enter;
- paper: an anticipatory session with the paper's policy (word boundaries,
  300 ms debounce, backstep at submit);
- headstart: an anticipatory session with our policy.
cold and prefix do no work while the user types, so their typing time is not
replayed (the engine is idle then either way); the sessions are replayed in
real time. Also measured: one decode step on a warm cache, the floor.
- llamacpp (optional, `bench/ttft_llamacpp.py`): llama.cpp on the same weights,
  the question sent at Enter, its prefix cache warm: the C++ `llama-server`
  (one slot: one user) when built, else llama-cpp-python's server; skipped
  with a note when neither is available. Its decode step is printed beside
  ours, and every mode's p50 TTFT and total are given as ratios to its.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path

from bench import ttft_checked
from bench.common import markdown_table, spider_questions, summarize_ms, write_json
from bench.peer_llamacpp import start_peer
from headstart.build import build_runtime
from headstart.candidates import CheckedAnswers
from headstart.engine.runner.ops import KERNEL_SETS
from headstart.engine.runtime import EngineRuntime
from headstart.replay_modes import replay_in_mode
from headstart.typist import Typist

MODES = ("cold", "prefix", "paper", "headstart")


def measure_decode_step(runtime: EngineRuntime, db: str, steps: int = 12) -> float:
    """Median ms of one decode step on a warm cache of the db's prompt."""
    prompt = runtime.prompt_for(db)
    ids = prompt.prompt_ids("How many rows are there?")

    def run() -> list[float]:
        state = runtime.runner.prefill(ids)
        times, token = [], 0
        for _ in range(steps):
            start = time.perf_counter()
            runtime.runner.extend(state, [token])
            token = int(state.last_logits.argmax())
            times.append((time.perf_counter() - start) * 1000.0)
        return times

    return statistics.median(runtime.worker.run_sync(run))


def _side_by_side_steps(runtime: EngineRuntime, peer_mode, db: str, first_ms: float, rounds: int = 3) -> dict:
    """llama.cpp's in-process decode step and ours, alternated `rounds` times before any question
    (both engines otherwise idle): their medians, `decode_step_ms` and `ours_side_by_side_ms`.
    The ratio of the two is the per-token comparison; {} when llama-cpp-python is not installed."""
    peer_runs, ours = [], [first_ms]
    for i in range(rounds):
        run = peer_mode.decode_step_ms(db)
        if not run:
            return {}
        peer_runs.append(run)
        if i < rounds - 1:
            with peer_mode.server.paused():
                ours.append(measure_decode_step(runtime, db))
    steps = [r["decode_step_ms"] for r in peer_runs]
    out = dict(peer_runs[0], decode_step_ms=statistics.median(steps), decode_step_rounds_ms=steps,
               ours_side_by_side_ms=statistics.median(ours), ours_side_by_side_rounds_ms=ours)
    print(f"one decode step, alternated {rounds} times: llama.cpp {out['decode_step_ms']:.1f} ms "
          f"{[round(x, 1) for x in steps]}, ours {out['ours_side_by_side_ms']:.1f} ms {[round(x, 1) for x in ours]}",
          flush=True)
    return out


def run_ttft_bench(model: str, dbs: list[str], questions: int, wpm: float, typo_rate: float, pause: float,
                   seed: int, dtype: str, device: str, threads: int | None, max_new_tokens: int, out: Path,
                   table_cache: str = "off", llamacpp: str = "auto", llamacpp_server: str = "auto",
                   fast_path: str = "auto", candidates: int = 1, candidates_wait_all: bool = False) -> dict:
    """With `table_cache` on, prefix and the sessions start from table blocks
    (outputs may then differ from cold: block assembly changes attention).
    `llamacpp` (auto|on|off): the llama.cpp peer mode (auto: when available);
    `llamacpp_server` (auto|cpp|python): which llama.cpp server runs it.
    `fast_path`: the kernels of every mode's forwards (cold, prefix and the
    sessions alike, `ModelRunner.set_fast_path`). `candidates` > 1: each mode
    decodes that many and the time to the checked answer is measured beside
    the greedy one's (`bench.ttft_checked`)."""
    if fast_path not in KERNEL_SETS:
        raise ValueError(f"unknown --fast-path {fast_path!r}; valid: {', '.join(KERNEL_SETS)}")
    # first: `--llamacpp on` without a llama.cpp server fails at once
    gguf_type = GGUF_OF_DTYPE.get(dtype, "f32")
    peer = start_peer(model, llamacpp, threads, gguf_type=gguf_type, server=llamacpp_server, parallel=1)
    runtime = build_runtime(model=model, dtype=dtype, device=device, threads=threads,
                            p0_cache_on_disk=False, table_cache=table_cache, fast_path=fast_path)
    print(f"fast path: {runtime.fast_path_choice.summary()}", flush=True)
    checked = CheckedAnswers(runtime.settings.spider_dir) if candidates > 1 else None
    cands = ttft_checked.candidate_params(candidates, candidates_wait_all, seed)
    peer_decode = None
    try:
        for db in dbs:  # resolve schemas and warm P0 before any clock starts
            runtime.base_state(runtime.prompt_for(db))
        with peer.paused() if peer else contextlib.nullcontext():
            runtime.complete(dbs[0], "warm up", "prefix", 2)
            decode_ms = measure_decode_step(runtime, dbs[0])
        # with llama.cpp beside us: one of our decode-step samples per question,
        # right after llama.cpp's answer (whose per-token time it reports), so
        # the two engines' steps are measured side by side, alternating
        decode_rounds: list[float] = []
        if peer:
            from bench.ttft_llamacpp import LlamaCppTtft

            peer_mode = LlamaCppTtft(peer, runtime, dbs)
            peer_decode = _side_by_side_steps(runtime, peer_mode, dbs[0], decode_ms)
        rows = []
        picked = spider_questions(dbs, questions, seed)
        for i, q in enumerate(picked):
            trace = Typist(wpm=wpm, typo_rate=typo_rate, pause_s=pause, seed=seed + i).trace(q["question"])
            outputs = {}
            # llama.cpp stopped while our modes run (its idle threads poll for work on the same cores)
            with peer.paused() if peer else contextlib.nullcontext():
                for mode in MODES:
                    checker = ttft_checked.make_checker(checked, q["db_id"], candidates_wait_all) if checked else None
                    _run_mode(runtime, q, i, trace, mode, max_new_tokens, outputs, rows, cands, checker)
            for row in rows[-len(MODES):]:
                row["identical_to_cold"] = outputs[row["mode"]] == outputs["cold"]
                row["tokens_as_cold"] = _common_prefix(outputs[row["mode"]], outputs["cold"])
            if peer:
                row = peer_mode.run(q["db_id"], q["question"], max_new_tokens, outputs["cold"])
                rows.append({"question": i, "db_id": q["db_id"], "text": q["question"], **row,
                             "typing_s": trace.submit_t, "keystrokes": len(trace.events)})
                print(f"  q{i} {q['db_id']:8s} llamacpp  ttft {row['ttft_ms']:8.1f} ms  same prompt tokens "
                      f"{row['same_prompt_tokens']}  same text as cold {row['identical_to_cold']}", flush=True)
                with peer.paused():
                    decode_rounds.append(measure_decode_step(runtime, dbs[0], steps=8))
                print(f"  q{i} decode step: ours {decode_rounds[-1]:.1f} ms, llama.cpp "
                      f"{(peer_mode.server_decode_ms or [float('nan')])[-1]:.1f} ms", flush=True)
        if decode_rounds:
            decode_ms = statistics.median(decode_rounds)
    finally:
        runtime.shutdown()
        if checked is not None:
            checked.close()
        if peer:
            peer.stop()
    if peer:
        peer_decode = dict(peer_decode, server=peer.describe(), threads=peer.threads, gguf_type=gguf_type,
                           gguf=peer.gguf.name, attention=getattr(peer, "cache_type", None),
                           server_decode_step_ms=peer_mode.server_decode_step_ms(),
                           rounds={"ours_ms": decode_rounds, "llamacpp_ms": list(peer_mode.server_decode_ms)})
    report = _report(rows, decode_ms, dict(model=model, dbs=dbs, questions=questions, wpm=wpm, typo_rate=typo_rate,
                                           pause=pause, seed=seed, dtype=dtype, device=device, threads=threads,
                                           max_new_tokens=max_new_tokens, table_cache=table_cache,
                                           llamacpp=llamacpp, fast_path=runtime.fast_path, candidates=candidates,
                                           candidates_wait_all=candidates_wait_all,
                                           fast_path_choice=runtime.fast_path_choice.to_dict()), peer_decode)
    _write(report, out)
    return report


def _run_mode(runtime, q: dict, i: int, trace, mode: str, max_new_tokens: int, outputs: dict, rows: list,
              candidates=None, checker=None) -> None:
    """One question in one of our modes: its row, and its tokens in `outputs`."""
    session_mode = mode in ("paper", "headstart")
    result = replay_in_mode(runtime, q["db_id"], trace, "session" if session_mode else mode,
                            policy=mode if session_mode else "headstart",
                            max_new_tokens=max_new_tokens, wait_typing=False, candidates=candidates,
                            checker=checker)
    outputs[mode] = result.token_ids
    rows.append({
        "question": i, "db_id": q["db_id"], "text": q["question"], "mode": mode,
        "ttft_ms": result.ttft_ms, "prompt_tokens": result.prompt_tokens,
        "cached_tokens_at_submit": result.cached_tokens_at_submit,
        "computed_tokens_at_submit": result.computed_tokens_at_submit,
        "wasted_tokens": result.wasted_tokens, "total_ms": result.total_ms,
        "num_tokens": len(result.token_ids),
        "answer_tokens_ready_at_submit": result.extra.get("answer_tokens_ready_at_submit", 0),
        # the whole answer (its stop token included) decoded ahead, before Enter
        "complete_at_submit": result.finish_reason == "stop" and result.extra.get(
            "answer_tokens_ready_at_submit", 0) > len(result.token_ids),
        "decode_forwards": result.extra.get("decode_forwards"),
        "typing_s": trace.submit_t, "keystrokes": len(trace.events),
        **ttft_checked.row_fields(result.extra),
    })
    checked = f"  checked {result.extra['checked_ms']:8.1f} ms" if "checked_ms" in result.extra else ""
    print(f"  q{i} {q['db_id']:8s} {mode:9s} ttft {result.ttft_ms:8.1f} ms  computed@submit "
          f"{result.computed_tokens_at_submit:4d}  wasted {result.wasted_tokens:4d}{checked}", flush=True)


GGUF_OF_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two answers share (where a drifting mode leaves cold)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _mean(values) -> float:
    """Mean of the known values (llama.cpp reports no cached-token counts): NaN when none."""
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else float("nan")


def _per_forward(rows: list[dict]) -> float | None:
    known = [r for r in rows if r.get("decode_forwards")]
    forwards = sum(r["decode_forwards"] for r in known)
    # each forward gives the tokens after the first, and the stop token's (one per answer)
    return (sum(r["num_tokens"] for r in known)) / forwards if forwards else None


def _report(rows: list[dict], decode_ms: float, config: dict, peer_decode: dict | None = None) -> dict:
    modes = {}
    for mode in MODES + tuple(sorted({r["mode"] for r in rows} - set(MODES))):
        mine = [r for r in rows if r["mode"] == mode]
        modes[mode] = {
            **summarize_ms([r["ttft_ms"] for r in mine]),
            "computed_tokens_at_submit_mean": _mean(r["computed_tokens_at_submit"] for r in mine),
            "wasted_tokens_mean": statistics.fmean(r["wasted_tokens"] for r in mine),
            "total_p50_ms": summarize_ms([r["total_ms"] for r in mine])["p50_ms"],
            "total_p99_ms": summarize_ms([r["total_ms"] for r in mine])["p99_ms"],
            "answer_tokens_ready_mean": statistics.fmean(r["answer_tokens_ready_at_submit"] for r in mine),
            "answer_tokens_p50": statistics.median(r["num_tokens"] for r in mine),
            "complete_at_submit_rate": statistics.fmean(bool(r.get("complete_at_submit")) for r in mine),
            # answer tokens per decode forward after the first token (prompt-lookup drafts: > 1)
            "tokens_per_forward": _per_forward(mine),
            "answer_tokens_max": max(r["num_tokens"] for r in mine),
            "prompt_tokens_mean": statistics.fmean(r["prompt_tokens"] for r in mine),
            # answers identical to cold's, and the leading tokens shared with it (our modes only)
            "identical_to_cold_rate": _mean(r["identical_to_cold"] for r in mine if "tokens_as_cold" in r),
            "tokens_as_cold_mean": _mean(r["tokens_as_cold"] for r in mine if "tokens_as_cold" in r),
            **ttft_checked.mode_stats(mine),
        }
    cold, prefix = modes["cold"]["p50_ms"], modes["prefix"]["p50_ms"]
    for stats in modes.values():
        stats["p50_vs_cold"] = stats["p50_ms"] / cold
        stats["p50_vs_prefix"] = stats["p50_ms"] / prefix
        stats["p50_vs_decode_step"] = stats["p50_ms"] / decode_ms
        stats["total_p50_vs_prefix"] = stats["total_p50_ms"] / modes["prefix"]["total_p50_ms"]
        if "llamacpp" in modes:  # ratios to the peer engine: < 1 is faster than llama.cpp
            stats["p50_vs_llamacpp"] = stats["p50_ms"] / modes["llamacpp"]["p50_ms"]
            stats["total_p50_vs_llamacpp"] = stats["total_p50_ms"] / modes["llamacpp"]["total_p50_ms"]
            ttft_checked.vs_peer(stats, modes["llamacpp"]["total_p50_ms"])
    peer = [r for r in rows if r["mode"] not in MODES]
    peer_step = None if peer_decode is None else (peer_decode.get("decode_step_ms")
                                                  or peer_decode.get("server_decode_step_ms"))
    return {"config": config, "decode_step_ms": decode_ms,
            "outputs_identical": all(r["identical_to_cold"] for r in rows if r["mode"] in MODES),
            "llamacpp": None if peer_decode is None else {
                "server": peer_decode.get("server"), "threads": peer_decode.get("threads"),
                "decode_step_ms": peer_step,
                "decode_step_source": "llama-cpp-python in-process, alternated with ours before the questions"
                if peer_decode.get("decode_step_ms") else "llama-server timings (predicted_per_token_ms)",
                # in-process: against our steps alternated with it; else llama-server's per-token
                # times against our steps right after each of its answers (decode_ms then)
                "ours_vs_llamacpp_decode": (peer_decode.get("ours_side_by_side_ms") or decode_ms) / peer_step
                if peer_step else None,
                "same_prompt_tokens": all(r["same_prompt_tokens"] for r in peer),
                "same_text_as_cold": all(r["identical_to_cold"] for r in peer),
                "same_text_count": sum(r["identical_to_cold"] for r in peer), "questions": len(peer),
                "gguf_decode": peer_decode},
            "modes": modes, "rows": rows}


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "ttft.json", report)
    peer = report.get("llamacpp")
    vs_peer = peer is not None and "p50_vs_llamacpp" in report["modes"]["cold"]
    header = ["mode", "TTFT mean ms", "TTFT p50 ms", "p90 ms", "p99 ms", "p50/cold", "p50/prefix",
              "p50/decode step", "computed@submit", "wasted tokens", "answer tokens ready", "complete at Enter",
              "answer tokens p50 (max)",
              "complete answer p50 ms", "complete p99 ms", "complete p50/prefix"] + (
                  ["TTFT p50/llamacpp", "complete p50/llamacpp"] if vs_peer else []) + (
                  ttft_checked.HEADER if report["config"].get("candidates", 1) > 1 else [])
    rows = [[m, s["mean_ms"], s["p50_ms"], s["p90_ms"], s["p99_ms"], f"{s['p50_vs_cold']:.3f}",
             f"{s['p50_vs_prefix']:.3f}", f"{s['p50_vs_decode_step']:.3f}",
             f"{s['computed_tokens_at_submit_mean']:.1f}", f"{s['wasted_tokens_mean']:.1f}",
             f"{s['answer_tokens_ready_mean']:.1f}", f"{s['complete_at_submit_rate']:.0%}",
             f"{s['answer_tokens_p50']:.0f} ({s['answer_tokens_max']})",
             s["total_p50_ms"], s["total_p99_ms"], f"{s['total_p50_vs_prefix']:.3f}"]
            + ([f"{s['p50_vs_llamacpp']:.3f}", f"{s['total_p50_vs_llamacpp']:.3f}"] if vs_peer else [])
            + (ttft_checked.table_cells(s) or (["-"] * len(ttft_checked.HEADER))
               if report["config"].get("candidates", 1) > 1 else [])
            for m, s in report["modes"].items()]
    peer_line = ("llamacpp mode: not run (no llama.cpp server available, or --llamacpp off)\n" if peer is None else
                 f"llamacpp ran on {peer['server']} ({peer['threads']} threads, {_peer_weights(peer)}); "
                 + (f"one llama.cpp decode step on the same weights ({peer['decode_step_source']}): "
                    f"{peer['decode_step_ms']:.1f} ms, ours / llama.cpp = {peer['ours_vs_llamacpp_decode']:.2f}; "
                    if peer["decode_step_ms"] else "")
                 + f"llama.cpp saw our prompt tokens: {peer['same_prompt_tokens']}, its text equals our cold "
                   f"output: {peer['same_text_as_cold']} ({peer['same_text_count']} of {peer['questions']})\n")
    c = report["config"]
    table = (f"TTFT, {c['model']} {c['dtype']} on {c['device']} ({c['threads']} threads, fast path "
             f"{c.get('fast_path', 'off')}), dbs {' '.join(c['dbs'])}, "
             f"{c['questions']} questions, {c['wpm']} wpm, typo rate {c['typo_rate']}, pause {c['pause']} s, "
             f"seed {c['seed']}; answers end at EOS (cap {c['max_new_tokens']} tokens)"
             + (f"; {c['candidates']} candidates, checked among "
                + ("all" if c.get("candidates_wait_all") else "those ready with the greedy answer")
                if c.get("candidates", 1) > 1 else "") + "\n\n"
             + markdown_table(header, rows) + _forwards_line(report) +
             f"\none decode step on a warm cache: {report['decode_step_ms']:.1f} ms"
             + (" (median of one sample per question, each right after llama.cpp's answer)"
                if peer and (peer.get("gguf_decode") or {}).get("rounds", {}).get("ours_ms") else "") + "; "
             f"outputs identical to cold in every mode: {report['outputs_identical']}\n" + peer_line
             + _choice_line(c.get("fast_path_choice")))
    (out / "ttft.md").write_text(table)
    print("\n" + table)
    _plot(report, out / "ttft.png")


def _peer_weights(peer: dict) -> str:
    """What llama.cpp served: the model's own GGUF file with its default attention, or a conversion."""
    gguf = peer.get("gguf_decode") or {}
    if gguf.get("attention") == "default":
        return f"the same GGUF file ({gguf.get('gguf')}), llama.cpp's default KV type and flash attention"
    return f"GGUF {gguf.get('gguf_type', 'f32')}, KV {gguf.get('attention') or 'f32'}"


def _forwards_line(report: dict) -> str:
    parts = [f"{m} {s['tokens_per_forward']:.2f}" for m, s in report["modes"].items() if s.get("tokens_per_forward")]
    return ("\nanswer tokens per decode forward (prompt-lookup drafts): " + ", ".join(parts)) if parts else ""


def _choice_line(choice: dict | None) -> str:
    """The kernels and, when `auto` measured them, each candidate's timings on this machine."""
    if not choice:
        return ""
    if not choice["measured"]:
        return f"kernels: {choice['kernels']} (requested {choice['requested']}, not timed)\n"
    timings = "; ".join(f"{name} " + ", ".join(f"{w} {ms:.1f}" for w, ms in t.items())
                        + f" = {choice['scores_ms'][name]:.0f} ms per answer"
                        for name, t in choice["timings_ms"].items())
    return (f"kernels: {choice['kernels']} (auto: min ms per workload over {choice['rounds']} rounds, "
            f"{choice['seconds']:.1f} s at start: {timings})\n")


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    modes = list(report["modes"])
    data = [[max(r["ttft_ms"], 0.01) for r in report["rows"] if r["mode"] == m] for m in modes]
    ax.boxplot(data, tick_labels=modes, showmeans=True)
    ax.axhline(report["decode_step_ms"], color="grey", linestyle="--", label="one decode step")
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (ms, log scale)")
    ax.set_title(f"TTFT per mode, pause {report['config']['pause']} s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
