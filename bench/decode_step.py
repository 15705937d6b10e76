"""`headstart bench decode-step`: one decode step per fast path, dtype and batch size.

A person waits for the complete SQL, and every answer token after the first
is one decode step: one forward that reads every weight once. This measures
that step on a warm cache of a real prompt, for each kernel choice of
`ModelRunner.set_fast_path` (`off`: the runner's layers with the model's
own modules; `onednn`; `native`; `inductor`), each dtype, and a batch of `rows`
decode rows sharing one forward (continuous batching). Reported per case:
setup time (packing or compiling the kernels), min and median ms per step of
`steps` steps, and the weight bytes read per second at the min. Also per
kernel set: one cold prefill of the whole prompt (`prefill_ms`, a cold
TTFT's forward), so kernels fast at decoding but slow at prefill show. The
`auto` case is what `HEADSTART_FAST_PATH=auto` picks on this machine
(`fast_path_auto`, timed at setup; `installed` names the pick).

Every case also decodes greedily from the same prompt and checks its tokens
against the `off` case's of the same dtype (`same_tokens`): a kernel that
changed the answer would show here.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from headstart.models.gguf_model import packed_bytes
from headstart.models.quantized import is_quantized

from bench.common import markdown_table, write_json
from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row
from headstart.models.loader import load_model

CASES = ("off", "onednn", "native", "inductor", "quant", "auto")


def _weights_bytes(model) -> int:
    """Bytes one decode step reads: every layer's weights and the LM head (the
    embedding table is indexed, not read; with tied weights it is the head).
    A quantized model's: its packed matrices (the head's included)."""
    if is_quantized(model):
        return packed_bytes(model)
    layers = sum(p.numel() * p.element_size() for p in model.model.layers.parameters())
    head = model.lm_head.weight
    return layers + head.numel() * head.element_size()


def _decode(runner: ModelRunner, states: list[KVState], tokens: list[int],
            steps: int) -> tuple[list[float], list[list[int]]]:
    """`steps` greedy decode steps of every row at once; ms per step and each row's tokens."""
    times, out = [], [[] for _ in states]
    for _ in range(steps):
        start = time.perf_counter()
        if len(states) == 1:
            runner.extend(states[0], [tokens[0]])
        else:
            runner.extend_rows([Row(s, [t]) for s, t in zip(states, tokens)])
        times.append((time.perf_counter() - start) * 1000.0)
        tokens = [int(s.last_logits.argmax()) for s in states]
        for row, t in zip(out, tokens):
            row.append(t)
    return times, out


def _timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0


def _case(runner: ModelRunner, case: str, base: KVState, rows: int, steps: int, warm_rows: tuple[int, ...],
          prefill_ids: list[int] | None = None) -> dict:
    start = time.perf_counter()
    installed = runner.set_fast_path(case, warm_rows=warm_rows)
    if installed != case and case != "auto":
        return {"skipped": f"{case} is not available for this model/dtype (resolved to {installed})"}
    setup_s = time.perf_counter() - start
    prefill_ms = None
    if prefill_ids is not None:  # a cold prefill of the whole prompt: min of two, after a short warm one
        runner.prefill(prefill_ids[:64])
        prefill_ms = min(_timed_ms(lambda: runner.prefill(prefill_ids)) for _ in range(2))
    states = [base.copy() for _ in range(rows)]
    first = int(base.last_logits.argmax())
    _decode(runner, [s.copy() for s in states], [first] * rows, 2)  # warm (first-call allocations)
    times, tokens = _decode(runner, states, [first] * rows, steps)
    result = {"setup_s": setup_s, "min_ms": min(times), "p50_ms": statistics.median(times),
              "tokens": tokens[0], "installed": runner.fast_path, "prefill_ms": prefill_ms}
    if case == "auto":
        result["auto"] = runner.choice.to_dict()
    return result


def run_decode_step_bench(model: str, dtypes: list[str], cases: list[str], rows: list[int], steps: int,
                          prompt_tokens: int, threads: int | None, out: Path) -> dict:
    """Measure every (dtype, case, rows) and write decode_step.json/.md/.png under `out`."""
    if threads:
        torch.set_num_threads(threads)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}; valid: {', '.join(CASES)}")
    results = []
    for dtype in dtypes:
        loaded = load_model(model, dtype)
        m = loaded.model
        ids = [(1000 + 37 * i) % 150000 for i in range(prompt_tokens)]
        runner = ModelRunner(m, fast_path="off")
        base = runner.prefill(ids)
        gib = _weights_bytes(m) / 2**30
        reference = None
        for case in cases:
            for n in rows:
                r = _case(runner, case, base, n, steps, tuple(sorted(set(rows))), ids if n == rows[0] else None)
                row = {"dtype": dtype, "case": case, "rows": n, **r}
                if "skipped" not in r:
                    if case == "off" and n == rows[0]:
                        reference = r["tokens"]
                    row["same_tokens"] = None if reference is None else r["tokens"] == reference
                    row["gib_per_s"] = gib / (r["min_ms"] / 1000.0)
                results.append(row)
                print(f"  {dtype:9s} {case:9s} rows {n:2d} " + (r["skipped"] if "skipped" in r else
                      f"[{r['installed']}] setup {r['setup_s']:6.1f} s  min {r['min_ms']:7.1f} ms  "
                      f"p50 {r['p50_ms']:7.1f} ms  "
                      + (f"prefill {r['prefill_ms']:7.1f} ms  " if r["prefill_ms"] is not None else "") +
                      f"{row['gib_per_s']:5.1f} GiB/s  same tokens {row['same_tokens']}"), flush=True)
        runner.set_fast_path("off")
        del loaded, m, base, runner
    load = _load_average()
    report = {"config": dict(model=model, dtypes=dtypes, cases=cases, rows=rows, steps=steps,
                             prompt_tokens=prompt_tokens, threads=threads or torch.get_num_threads()),
              "load_average": load, "results": results}
    _write(report, out)
    return report


def _load_average() -> list[float] | None:
    try:
        import os

        return list(os.getloadavg())
    except OSError:
        return None


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "decode_step.json", report)
    header = ["dtype", "kernels", "rows", "setup s", "min ms/step", "p50 ms/step", "GiB/s at min",
              "cold prefill ms", "same tokens as off"]
    rows = [[r["dtype"], r["case"] if r["installed"] == r["case"] else f"{r['case']} ({r['installed']})", r["rows"],
             r["setup_s"], r["min_ms"], r["p50_ms"], r["gib_per_s"],
             "-" if r.get("prefill_ms") is None else r["prefill_ms"], r["same_tokens"]]
            for r in report["results"] if "skipped" not in r]
    c, load = report["config"], report["load_average"]
    table = (f"One decode step, {c['model']}, prompt {c['prompt_tokens']} tokens, {c['threads']} threads, "
             f"{c['steps']} steps per case; load average {load}\n\n" + markdown_table(header, rows))
    skipped = [f"{r['dtype']} {r['case']}: {r['skipped']}" for r in report["results"] if "skipped" in r]
    if skipped:
        table += "\nskipped: " + "; ".join(sorted(set(skipped))) + "\n"
    (out / "decode_step.md").write_text(table)
    print("\n" + table)
    _plot(report, out / "decode_step.png")


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in report["results"] if "skipped" not in r]
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['dtype']}\n{r['case']}\n{r['rows']} row(s)" for r in done]
    ax.bar(range(len(done)), [r["min_ms"] for r in done], label="min")
    ax.scatter(range(len(done)), [r["p50_ms"] for r in done], color="black", zorder=3, label="p50")
    ax.set_xticks(range(len(done)), labels, fontsize=7)
    ax.set_ylabel("ms per decode step")
    ax.set_title("One decode step per kernel choice")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
