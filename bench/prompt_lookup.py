"""`headstart bench prompt-lookup`: what prompt-lookup drafts buy on real answers, and at what cost.

A decode step may check drafted tokens in the same forward
(`engine/requests/prompt_lookup.py`): the answer is unchanged, the forwards fewer, each
forward dearer (it runs 1 + k tokens). Whether that pays depends on how often
the drafts are right on real answers and on what a forward of a few tokens
costs on this CPU's kernels. This benchmark measures both and combines them:

1. the cost of one forward of M = 1..(1 + max k) tokens on a warm cache of a
   Spider prompt, on the kernels of every instruction-set level this CPU runs
   (median of rounds, levels alternating);
2. the answers of a finished `headstart eval` run (greedy, the real model):
   each is replayed token by token with the drafter (n-grams of `ngram_min`..3,
   k tokens), counting the forwards and the tokens each one checks;
3. per (k, n-gram minimum, level): tokens per forward and the decode time
   relative to no drafts (sum of the forwards' measured costs).

Writes prompt-lookup.json, prompt-lookup.md and prompt-lookup.png.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from bench.common import markdown_table, write_json

KS = (1, 2, 3, 4, 6)
NGRAM_MINS = (1, 2)


def forward_costs(model_spec: str, levels: list[str], max_tokens: int, rounds: int = 5) -> dict[str, list[float]]:
    """ms of one forward of M tokens (M = 1..max_tokens) on a warm cache, per kernel level."""
    import torch

    from headstart.engine.runner.model_runner import ModelRunner
    from headstart.kernels import quant as qk
    from headstart.models import load_model
    from headstart.prompt import PromptBuilder
    from headstart.schema.resolve import resolve_database

    loaded = load_model(model_spec)
    runner = ModelRunner(loaded.model, fast_path="auto")
    if runner.fast_path != "quant":
        raise ValueError(f"{model_spec} is not served quantized: drafts run on the quantized kernels only")
    ops = runner.ops
    ids = PromptBuilder(loaded.tokenizer, resolve_database("world_1").schema).prompt_ids("How many cities are there?")
    base = runner.prefill(ids)
    kernels = {level: qk.load(level) for level in levels}
    samples: dict[str, list[list[float]]] = {level: [[] for _ in range(max_tokens)] for level in levels}
    with torch.inference_mode():
        for r in range(rounds):
            for level in levels if r % 2 == 0 else levels[::-1]:
                ops.kernel = kernels[level]
                for m in range(1, max_tokens + 1):
                    state = base.share()
                    start = time.perf_counter()
                    runner.extend(state, ids[-m:])
                    samples[level][m - 1].append((time.perf_counter() - start) * 1000.0)
    return {level: [statistics.median(s) for s in per_m] for level, per_m in samples.items()}


def replay(run: Path, limit: int | None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + EOS) of a finished eval run's scored questions."""
    from headstart.models import load_tokenizer
    from headstart.paths import default_tokenizer_dir
    from headstart.prompt import PromptBuilder
    from headstart.schema.resolve import resolve_database

    tok = load_tokenizer(default_tokenizer_dir())
    data = json.loads((run / "eval.json").read_text())
    questions = [q for q in data["questions"] if q["status"] == "scored"][:limit]
    builders: dict[str, PromptBuilder] = {}
    cases = []
    for q in questions:
        if q["db_id"] not in builders:
            builders[q["db_id"]] = PromptBuilder(tok, resolve_database(q["db_id"]).schema)
        prompt = builders[q["db_id"]].prompt_ids(q["question"])
        cases.append((prompt, tok(q["pred_text"], add_special_tokens=False)["input_ids"] + [151645]))
    return cases


def simulate(cases, k: int, ngram_min: int) -> tuple[int, list[int]]:
    """(answer tokens after the first, the size M of each forward) with drafts of up to k tokens."""
    from headstart.engine.requests.prompt_lookup import NGRAM_MAX, draft

    sizes, tokens = [], 0
    for prompt, answer in cases:
        i = 1  # the first token comes from the prefill's logits
        while i < len(answer):
            guess = draft(prompt + answer[:i], k, NGRAM_MAX, ngram_min)
            right = 0
            while right < len(guess) and i + right < len(answer) and guess[right] == answer[i + right]:
                right += 1
            sizes.append(1 + len(guess))
            i += right + 1
        tokens += len(answer) - 1
    return tokens, sizes


def run_prompt_lookup_bench(run: Path, out: Path, model: str, limit: int | None = 300) -> dict:
    from headstart.kernels import cpu_isa

    levels = [level.name for level in cpu_isa.supported()]
    cases = replay(run, limit)
    costs = forward_costs(model, levels, 1 + max(KS))
    rows = []
    for ngram_min in NGRAM_MINS:
        for k in KS:
            tokens, sizes = simulate(cases, k, ngram_min)
            row = {"k": k, "ngram_min": ngram_min, "tokens_per_forward": tokens / len(sizes)}
            for level, c in costs.items():
                row[f"time_vs_none_{level}"] = sum(c[m - 1] for m in sizes) / (tokens * c[0])
            rows.append(row)
    report = {"config": {"run": str(run), "model": model, "answers": len(cases), "levels": levels},
              "forward_ms": costs, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "prompt-lookup.json", report)
    header = ["k", "n-gram min", "tokens / forward"] + [f"decode time vs no drafts ({lv})" for lv in levels]
    table = markdown_table(header, [[r["k"], r["ngram_min"], f"{r['tokens_per_forward']:.2f}"]
                                    + [f"{r[f'time_vs_none_{lv}']:.3f}" for lv in levels] for r in rows])
    cost_table = markdown_table(["M (tokens in the forward)"] + [f"ms ({lv})" for lv in levels],
                                [[m + 1] + [f"{costs[lv][m]:.1f}" for lv in levels] for m in range(1 + max(KS))])
    text = (f"prompt-lookup drafts on {len(cases)} answers of {run} ({model})\n\n{table}\n\n"
            f"one forward of M tokens on a warm cache (median):\n\n{cost_table}\n")
    (out / "prompt-lookup.md").write_text(text)
    print(text)
    _plot(report, out / "prompt-lookup.png")
    return report


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for level in report["config"]["levels"]:
        for ngram_min in NGRAM_MINS:
            pts = [(r["k"], r[f"time_vs_none_{level}"]) for r in report["rows"] if r["ngram_min"] == ngram_min]
            ax.plot(*zip(*pts), "-o", label=f"{level}, n-grams from {ngram_min}")
    ax.axhline(1.0, color="grey", linestyle="--")
    ax.set_xlabel("drafted tokens per step (k)")
    ax.set_ylabel("decode time vs no drafts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
