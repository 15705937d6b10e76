"""`headstart bench candidate-rows`: what K candidate rows cost per decode step, per kernel level.

A request with K candidates (`engine/requests/candidates.py`) decodes the
greedy answer and K-1 sampled ones as rows of the same packed forward over
the shared prompt: each row's cache is a share of the prompt's (the
prompt's blocks listed once, its own blocks from its first write). Each
decode step then reads every weight once for all K rows, plus each row's
attention over the prompt. This measures one such step of K rows
(K = 1, 2, 4, 8) on a warm cache of a Spider prompt, on the kernels of
every instruction-set level this CPU runs (levels and K alternating, median
of rounds): ms per step, ms per row, and the step's cost relative to K = 1
(the median of each round's ratio: on a loaded machine the rounds differ
more than the cases of one round do).

Per round and case: K fresh shares of the prompt's cache, one untimed step
(each row's first write copies the prompt's last, partly filled block, as a
candidate's first step does), then `steps` timed steps, each one packed
forward of the K rows (`ModelRunner.extend_rows`, as the worker runs them).

Writes candidate_rows.json, candidate_rows.md and candidate_rows.png.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable

from bench.common import cpu_name, markdown_table, write_json

KS = (1, 2, 4, 8)
DB, QUESTION = "concert_singer", "What are the names of the singers who performed in a concert in 2014?"


def prompt_ids(tokenizer, db: str = DB, question: str = QUESTION) -> list[int]:
    """The engine's prompt of `question` on `db` (270 tokens for the default: a Spider dev question's size)."""
    from headstart.prompt import PromptBuilder
    from headstart.schema.resolve import resolve_database

    return PromptBuilder(tokenizer, resolve_database(db).schema).prompt_ids(question)


def kernel_levels(runner) -> dict[str, Callable[[], None]]:
    """Per level name, what installs it: every ISA level of the quantized kernels this CPU runs,
    or, for a model not served quantized, the runner's own kernels alone (named by its fast path)."""
    if runner.fast_path != "quant":
        return {runner.fast_path: lambda: None}
    from headstart.kernels import cpu_isa
    from headstart.kernels import quant as qk

    ops = runner.ops

    def install(kernel):
        def go():
            ops.kernel = kernel
        return go

    return {level.name: install(qk.load(level.name)) for level in cpu_isa.supported()}


def step_samples(runner, ids: list[int], levels: dict[str, Callable[[], None]], ks: tuple[int, ...] = KS,
                 rounds: int = 7, steps: int = 3) -> dict[str, dict[int, list[float]]]:
    """ms of one packed decode step of K rows from a shared prompt: every timed step, per level and K.

    Rows start from shares of one prefill of `ids` and decode the K most likely first
    tokens (distinct rows, as sampled candidates mostly are), then their own argmax."""
    import torch

    from headstart.engine.runner.rows import Row

    base = runner.prefill(ids)
    first = torch.topk(base.last_logits.float(), max(ks)).indices.tolist()
    samples: dict[str, dict[int, list[float]]] = {name: {k: [] for k in ks} for name in levels}
    names = list(levels)
    with torch.inference_mode():
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                levels[name]()
                for k in ks if r % 2 == 0 else ks[::-1]:
                    states = [base.share() for _ in range(k)]
                    tokens = first[:k]
                    for step in range(steps + 1):  # step 0: the rows' first writes (copy on write), untimed
                        start = time.perf_counter()
                        runner.extend_rows([Row(s, [t]) for s, t in zip(states, tokens)])
                        ms = (time.perf_counter() - start) * 1000.0
                        if step:
                            samples[name][k].append(ms)
                        tokens = [int(s.last_logits.argmax()) for s in states]
                    del states
    return samples


def summarize(samples: dict[str, dict[int, list[float]]], steps: int) -> list[dict]:
    """Per level and K: the median and min ms per step, the median ms per row, and the step's cost
    relative to the smallest K's, the median of each round's ratio (`steps` samples a round: the
    cases of one round ran back to back, so a ratio within a round sees the same load)."""
    out = []
    for level, per_k in samples.items():
        rounds = {k: [statistics.median(v[i:i + steps]) for i in range(0, len(v), steps)] for k, v in per_k.items()}
        base = rounds[min(per_k)]
        for k, values in per_k.items():
            step = statistics.median(values)
            out.append({"level": level, "k": k, "samples": len(values), "step_ms": step, "min_ms": min(values),
                        "row_ms": step / k,
                        "vs_k1": statistics.median(a / b for a, b in zip(rounds[k], base))})
    return out


def run_candidate_rows_bench(model: str, out: Path, threads: int | None = 1, rounds: int = 7, steps: int = 3,
                             ks: tuple[int, ...] = KS, dtype: str | None = None) -> dict:
    """Measure, print the table, write candidate_rows.json/.md/.png under `out`."""
    import torch

    from headstart.engine.runner.model_runner import ModelRunner
    from headstart.models import load_model

    if not ks or min(ks) < 1 or rounds < 1 or steps < 1:
        raise ValueError("K values must be >= 1, rounds and steps >= 1")
    ks = tuple(sorted(set(ks)))
    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model, dtype) if dtype else load_model(model)
    runner = ModelRunner(loaded.model, fast_path="auto")
    ids = prompt_ids(loaded.tokenizer)
    levels = kernel_levels(runner)
    started = time.perf_counter()
    load_before = _load_average()
    samples = step_samples(runner, ids, levels, ks, rounds, steps)
    report = {"config": {"model": model, "fast_path": runner.fast_path, "levels": list(levels), "ks": list(ks),
                         "prompt_tokens": len(ids), "rounds": rounds, "steps": steps,
                         "threads": threads or torch.get_num_threads(), "cpu": cpu_name()},
              "load_average": {"before": load_before, "after": _load_average()},
              "seconds": time.perf_counter() - started, "samples_ms": samples, "rows": summarize(samples, steps)}
    _write(report, out)
    return report


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None




def _write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "candidate_rows.json", report)
    c, rows = report["config"], report["rows"]
    levels = c["levels"]
    by = {(r["level"], r["k"]): r for r in rows}
    header = ["K (rows)"] + [f"{h} ({lv})" for lv in levels for h in ("ms / step", "min", "ms / row", "vs K=1")]
    body = [[k] + [v for lv in levels for v in (
        f"{by[lv, k]['step_ms']:.1f}", f"{by[lv, k]['min_ms']:.1f}", f"{by[lv, k]['row_ms']:.1f}",
        f"{by[lv, k]['vs_k1']:.2f}x")] for k in c["ks"]]
    load = report["load_average"]
    text = (f"One decode step of K candidate rows from a shared prompt of {c['prompt_tokens']} tokens, "
            f"{c['model']} ({c['fast_path']} kernels), {c['threads']} thread(s), median of {c['rounds']} rounds x "
            f"{c['steps']} steps (vs K=1: the median of the rounds' ratios), levels and K alternating; {c['cpu']}; load average {load['before']} -> "
            f"{load['after']}\n\n" + markdown_table(header, body))
    (out / "candidate_rows.md").write_text(text)
    print("\n" + text)
    _plot(report, out / "candidate_rows.png")


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    for level in report["config"]["levels"]:
        pts = [r for r in report["rows"] if r["level"] == level]
        left.plot([r["k"] for r in pts], [r["step_ms"] for r in pts], "-o", label=level)
        right.plot([r["k"] for r in pts], [r["row_ms"] for r in pts], "-o", label=level)
    for ax, label in ((left, "ms per decode step"), (right, "ms per row")):
        ax.set_xlabel("candidate rows in the step (K)")
        ax.set_ylabel(label)
        ax.set_xticks(report["config"]["ks"])
        ax.legend()
    fig.suptitle(f"K candidate rows per decode step, {report['config']['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
