"""`headstart bench batch-invariance`: how far a batched row is from its lone forward.

A row of a batched forward equals its lone forward only up to floating-point
reassociation (the matrix products see a different M), so outside float64 a
near-tie can flip when sessions share a forward. For each dtype and kernel
choice this measures the largest |batched - lone| logit over `rows` rows
(caches of different lengths, a few new tokens each), with
HEADSTART_BATCH_INVARIANT off and on, and the ms of the batched forward
(min of `repeats`): on makes them bit-identical at the cost of reading the
weights once per row.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from bench.common import markdown_table, write_json
from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row
from headstart.models.loader import load_model


def _measure(runner: ModelRunner, rows: int, new_tokens: int, repeats: int) -> dict:
    prompts = [[(1000 + 37 * i + 11 * r) % 150000 for i in range(40 + 60 * r)] for r in range(rows)]
    extra = [[(500 + 7 * r + j) % 150000 for j in range(1 + (r + new_tokens - 1) % new_tokens)] for r in range(rows)]
    bases = [runner.prefill(p) for p in prompts]
    lone = []
    for base, e in zip(bases, extra):
        state = base.copy()
        runner.extend(state, e)
        lone.append(state.last_logits)
    times, batched = [], None
    for _ in range(repeats):
        states: list[KVState] = [b.copy() for b in bases]
        start = time.perf_counter()
        runner.extend_rows([Row(s, e) for s, e in zip(states, extra)])
        times.append((time.perf_counter() - start) * 1000.0)
        batched = [s.last_logits for s in states]
    diff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(lone, batched))
    return {"max_abs_diff": diff, "bit_identical": all(torch.equal(a, b) for a, b in zip(lone, batched)),
            "batched_forward_min_ms": min(times), "tokens": sum(len(e) for e in extra)}


def run_batch_invariance_bench(model: str, dtypes: list[str], kernels: list[str], rows: int, new_tokens: int,
                               repeats: int, threads: int | None, out: Path) -> dict:
    """Measure every (dtype, kernels, invariant off/on); write batch_invariance.json/.md/.png under `out`."""
    if threads:
        torch.set_num_threads(threads)
    results = []
    for dtype in dtypes:
        runner = ModelRunner(load_model(model, dtype).model)
        for kernel in kernels:
            for invariant in (False, True):
                installed = runner.set_fast_path(kernel, batch_invariant=invariant)
                if installed != kernel:
                    continue
                r = {"dtype": dtype, "kernels": kernel, "batch_invariant": invariant,
                     **_measure(runner, rows, new_tokens, repeats)}
                results.append(r)
                print(f"  {dtype:9s} {kernel:8s} invariant {invariant!s:5s} max |batched - lone| "
                      f"{r['max_abs_diff']:.3g}  bit-identical {r['bit_identical']}  batched forward "
                      f"{r['batched_forward_min_ms']:.1f} ms", flush=True)
        del runner
    report = {"config": dict(model=model, dtypes=dtypes, kernels=kernels, rows=rows, new_tokens=new_tokens,
                             repeats=repeats, threads=threads or torch.get_num_threads()),
              "load_average": list(__import__("os").getloadavg()), "results": results}
    _write(report, out)
    return report


def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "batch_invariance.json", report)
    header = ["dtype", "kernels", "batch invariant", "max abs(batched - lone) logit", "bit-identical",
              "batched forward min ms"]
    rows = [[r["dtype"], r["kernels"], r["batch_invariant"], f"{r['max_abs_diff']:.3g}", r["bit_identical"],
             r["batched_forward_min_ms"]] for r in report["results"]]
    c = report["config"]
    table = (f"Batch invariance, {c['model']}, {c['rows']} rows x up to {c['new_tokens']} new tokens, "
             f"{c['threads']} threads, load average {report['load_average']}\n\n" + markdown_table(header, rows))
    (out / "batch_invariance.md").write_text(table)
    print("\n" + table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['dtype']}\n{r['kernels']}\n{'inv' if r['batch_invariant'] else 'packed'}" for r in report["results"]]
    ax.bar(range(len(labels)), [r["batched_forward_min_ms"] for r in report["results"]])
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("batched forward, min ms")
    ax.set_title("Cost of batch invariance")
    fig.tight_layout()
    fig.savefig(out / "batch_invariance.png", dpi=120)
    plt.close(fig)
