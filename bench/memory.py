"""`headstart bench memory`: what the KV caches of a replica cost, measured.

1. Bytes per cached token: a session's private bytes over its private tokens
   (and a P0's bytes over its tokens), against the formula
   layers x 2 (K, V) x kv_heads x head_dim x dtype bytes.
2. Sessions that fit one KV budget: sessions are opened one by one on a
   runtime with `kv_budget_bytes`, each types a Spider question (its cache
   extended for real), until the first eviction; with P0 shared (the
   engine: `KVState.share`) and with P0 deep-copied per session (as main
   did: `KVState.copy`, patched in for that run only).
3. Peak extra memory of a batched forward of 8 rows of different cache
   lengths, each extending a few tokens: the model runner's packed forward
   (`ModelRunner.extend_rows`) against the padded copy it replaced
   (`bench.memory_padded`). Measured with torch's profiler (`profile_memory`:
   the allocator's running total during the forward; peak minus start).

Writes memory.json, memory.md and memory.png under --out.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import markdown_table, spider_questions, write_json
from headstart.engine.kv.state import KVState
from headstart.engine.runner.rows import Row
from headstart.engine.runtime import EngineRuntime
from bench.memory_padded import padded_extend_rows


def formula_bytes_per_token(config, dtype: torch.dtype) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    elem = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * elem


def peak_allocated_bytes(fn) -> tuple[int, float]:
    """(peak bytes allocated above the start while `fn` runs, its ms)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        started = time.perf_counter()
        fn()
        elapsed = (time.perf_counter() - started) * 1000.0
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return (max(totals) if totals else 0), elapsed


def measure_bytes_per_token(runtime: EngineRuntime, db: str, question: str) -> dict:
    session = runtime.open_session(db)
    try:
        session.update(1, question)
        session.wait_idle(120)
        stats = session.stats()
        p0 = runtime.base_state(runtime.prompt_for(db))
        private_tokens = stats.cached_tokens - p0.num_tokens
        return {
            "measured": stats.memory_bytes / private_tokens,
            "measured_p0": p0.nbytes() / p0.num_tokens,
            "formula": formula_bytes_per_token(runtime.model.config, runtime.loaded.dtype),
            "private_tokens": private_tokens, "p0_tokens": p0.num_tokens,
        }
    finally:
        runtime.close_session(session.session_id)


def sessions_at_budget(runtime: EngineRuntime, db: str, questions: list[str], budget: int, copied: bool,
                       limit: int) -> int:
    """Sessions resident when the first eviction comes (module doc, 2)."""
    runtime.sessions.close_all()
    runtime.sessions.evicted = 0
    runtime.kv_memory.budget_bytes = budget
    share = KVState.share
    if copied:
        KVState.share = KVState.copy  # main's behaviour, for this run only
    try:
        resident = 0
        for i in range(limit):
            session = runtime.open_session(db)
            if runtime.sessions.evicted:
                return resident
            session.update(1, questions[i % len(questions)])
            session.wait_idle(120)
            resident = len(runtime.sessions)
        return resident
    finally:
        KVState.share = share
        runtime.sessions.close_all()
        runtime.kv_memory.budget_bytes = 0


def batched_forward_extra(runtime: EngineRuntime, db: str, questions: list[str], rows: int, new_tokens: int) -> dict:
    prompt = runtime.prompt_for(db)
    model, runner = runtime.model, runtime.runner
    states, news = [], []
    for i in range(rows):
        ids = prompt.prompt_ids(questions[i % len(questions)])
        cut = max(len(prompt.base_ids), len(ids) - new_tokens)
        state = runtime.worker.run_sync(lambda ids=ids[:cut]: runner.prefill(ids))
        states.append(state)
        news.append(ids[cut:cut + new_tokens] or ids[-1:])

    def calls():  # the runner appends to the rows' caches: give it copies
        return [Row(s.copy(), n, True, None) for s, n in zip(states, news)]

    def run_now(rows):
        return lambda: runner.extend_rows(rows)

    def run_padded():
        padded_extend_rows(model, states, news)

    rows_now = calls()  # made before the measurement
    now_bytes, _ = runtime.worker.run_sync(lambda: peak_allocated_bytes(run_now(rows_now)))
    padded_bytes, _ = runtime.worker.run_sync(lambda: peak_allocated_bytes(run_padded))
    now_ms = statistics.median(runtime.worker.run_sync(lambda: _timed(run_now(calls()))) for _ in range(3))
    padded_ms = statistics.median(runtime.worker.run_sync(lambda: _timed(run_padded)) for _ in range(3))
    copies_bytes = sum(s.nbytes() for s in states)
    invariance = runtime.worker.run_sync(lambda: _batched_vs_lone(runner, states, news))
    return {
        "now": now_bytes, "padded_copy": padded_bytes,
        "now_ms": now_ms, "padded_copy_ms": padded_ms,
        "rows": rows, "new_tokens_per_row": new_tokens, **invariance,
        "cache_tokens": [s.num_tokens for s in states], "rows_cache_bytes": copies_bytes,
    }


def _batched_vs_lone(runner, states, news) -> dict:
    """Batch invariance: the largest |logit| difference between a row of the
    packed forward and the same row's lone extension, and whether any
    row's greedy token differs."""
    batched = [Row(s.copy(), n, True, None) for s, n in zip(states, news)]
    runner.extend_rows(batched)
    diff, flips = 0.0, 0
    for state, new, row in zip(states, news, batched):
        lone = state.copy()
        runner.extend(lone, new)
        diff = max(diff, float((lone.last_logits - row.state.last_logits).abs().max()))
        flips += int(lone.last_logits.argmax()) != int(row.state.last_logits.argmax())
    return {"max_abs_logit_diff_vs_lone": diff, "argmax_flips_vs_lone": flips}


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def run_memory_bench(model: str, db: str, dtype: str, device: str, threads: int | None, budget_mib: float,
                     rows: int, new_tokens: int, seed: int, out: Path, max_sessions: int = 2000) -> dict:
    runtime = EngineRuntime.from_settings(model=model, dtype=dtype, device=device, threads=threads,
                                          p0_cache_on_disk=False, answer_ahead_tokens=0,
                                          kv_session_reserve_tokens=0, max_sessions=max_sessions)
    try:
        questions = [q["question"] for q in spider_questions([db], 16, seed)]
        budget = int(budget_mib * (1 << 20))
        report = {
            "model": model, "dtype": dtype, "db": db,
            "bytes_per_token": measure_bytes_per_token(runtime, db, questions[0]),
            "sessions_at_budget": {
                "budget_bytes": budget,
                "shared_p0": sessions_at_budget(runtime, db, questions, budget, False, max_sessions),
                "copied_p0": sessions_at_budget(runtime, db, questions, budget, True, max_sessions),
            },
            "batched_forward_extra_bytes": batched_forward_extra(runtime, db, questions, rows, new_tokens),
        }
    finally:
        runtime.shutdown()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "memory.json", report)
    table = _table(report)
    (out / "memory.md").write_text(table)
    _plot(report, out / "memory.png")
    print(table)
    return report


def _table(report: dict) -> str:
    bpt, fit, fwd = report["bytes_per_token"], report["sessions_at_budget"], report["batched_forward_extra_bytes"]
    mib = 1 << 20
    rows = [
        ["KV bytes per token (session / P0 / formula)", f"{bpt['measured']:.0f} / {bpt['measured_p0']:.0f}",
         f"{bpt['formula']}"],
        [f"sessions in {fit['budget_bytes'] / mib:.0f} MiB (P0 shared / copied)", f"{fit['shared_p0']}",
         f"{fit['copied_p0']}"],
        [f"batched forward of {fwd['rows']} rows x {fwd['new_tokens_per_row']}: peak extra MiB (now / padded)",
         f"{fwd['now'] / mib:.2f}", f"{fwd['padded_copy'] / mib:.2f}"],
        ["the same forward, ms (now / padded)", f"{fwd['now_ms']:.0f}", f"{fwd['padded_copy_ms']:.0f}"],
        ["batched row vs its lone forward: max abs logit diff / argmax flips",
         f"{fwd['max_abs_logit_diff_vs_lone']:.2e}", f"{fwd['argmax_flips_vs_lone']}"],
    ]
    head = f"bench memory: {report['model']} {report['dtype']}, db {report['db']}\n\n"
    return head + markdown_table(["measure", "headstart", "reference"], rows)


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fit, fwd = report["sessions_at_budget"], report["batched_forward_extra_bytes"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].bar(["P0 shared", "P0 copied"], [fit["shared_p0"], fit["copied_p0"]], color=["tab:green", "tab:gray"])
    axes[0].set_title(f"sessions in {fit['budget_bytes'] / (1 << 20):.0f} MiB of KV")
    axes[1].bar(["packed (now)", "padded copy"], [fwd["now"] / (1 << 20), fwd["padded_copy"] / (1 << 20)],
                color=["tab:green", "tab:gray"])
    axes[1].set_title(f"peak extra MiB, batched forward of {fwd['rows']} rows")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
