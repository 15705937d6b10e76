"""Scheduler rules 6 and 7 with no model: what they change, and what they cost.

    python -m bench.scheduler_order --out bench-out/scheduler

1. **Fairness** (rule 6): tenant A queues N submits of `chunks` prefill
   steps each, with short prompts; tenant B then queues one submit with a
   longer one. Steps the worker runs before B's submit has run, with
   tenants named (rule 6) and without (every job of one tenant: rules 1-3
   only, shortest prefill first).
2. **Reranking** (rule 7): a queue of table-cache completions over one
   database's tables, served one per iteration through a device tier of
   `tier_blocks` blocks (LRU). Blocks loaded (tier misses) and the most
   later arrivals that overtook one completion, reranked (bound
   `max_delay`) against arrival order (`max_delay=0`).
3. **Cost**: `Scheduler.schedule()` with n waiting jobs (min and median of
   `repeats`; the only wall-clock numbers here).

Writes `scheduler_order.json`, `scheduler_order.md` and `scheduler_order.png`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import OrderedDict
from pathlib import Path

from bench.common import markdown_table, write_json
from headstart.engine.sched.scheduler import Scheduler
from headstart.engine.sched.jobs import Call, Job, Priority, StepOutcome


def _job(name: str, priority: Priority, tenant: str | None, key: float, steps: int = 1,
         blocks: frozenset[str] | None = None, cost: int = 8) -> Job:
    left = {"n": steps}

    def step() -> bool:
        left["n"] -= 1
        return left["n"] > 0

    job = Job(Call(step, key=key, tokens=cost), priority, name, owner=name)
    job.tenant, job.table_blocks = tenant, blocks
    return job


def fairness(flood: int, chunks: int, named: bool) -> int:
    """Steps run before B's submit has run (see module docstring)."""
    scheduler = Scheduler(max_batch_rows=1)  # one job a step: the order of service
    for i in range(flood):
        scheduler.add(_job(f"a{i}", Priority.SUBMIT, "A" if named else None, 0.1, chunks), 0.0)
    scheduler.add(_job("b", Priority.SUBMIT, "B" if named else None, 0.5), 0.0)
    steps = 0
    while True:
        plan = scheduler.schedule(0.0)
        steps += 1
        if any(row.job.name == "b" for row in plan.planned):
            return steps - 1
        scheduler.postprocess(plan, [StepOutcome(row.job.work.step()) for row in plan.planned], 0.0)


def reranking(n: int, tables: int, per_query: int, tier_blocks: int, max_delay: int, seed: int) -> dict:
    """Block loads and the worst overtaking, serving `n` queued completions."""
    rng = random.Random(seed)
    names = [f"db:t{k}" for k in range(tables)]
    tier: OrderedDict[str, None] = OrderedDict()
    scheduler = Scheduler(max_batch_rows=1, rerank_max_delay=max_delay)  # one completion a step
    scheduler.resident_table_blocks = lambda: frozenset(tier)
    jobs = [_job(f"q{i}", Priority.POOL, "A", 0.5, blocks=frozenset(rng.sample(names, per_query)))
            for i in range(n)]
    for job in jobs:
        scheduler.add(job, 0.0)
    arrival = {job.name: i for i, job in enumerate(jobs)}
    started: list[int] = []
    loads = 0
    while scheduler.num_waiting:
        plan = scheduler.schedule(0.0)
        for row in plan.planned:
            started.append(arrival[row.job.name])
            for block in sorted(row.job.table_blocks):
                if block in tier:
                    tier.move_to_end(block)
                    continue
                loads += 1
                tier[block] = None
                while len(tier) > tier_blocks:
                    tier.popitem(last=False)
        scheduler.postprocess(plan, [StepOutcome(row.job.work.step()) for row in plan.planned], 0.0)
    overtaken = max(sum(1 for j in started[:pos] if j > i) for pos, i in enumerate(started))
    return {"max_delay": max_delay, "block_loads": loads, "max_overtaken": overtaken}


def schedule_cost(n: int, table_jobs: bool, repeats: int, seed: int) -> dict:
    """Wall-clock ms of one `schedule()` over n waiting jobs of 4 tenants, batched groups of 8."""
    rng = random.Random(seed)
    names = [f"db:t{k}" for k in range(30)]
    times = []
    for _ in range(repeats):
        scheduler = Scheduler(max_batch_rows=8, max_batch_tokens=256, batch_scope="all")
        for i in range(n):
            blocks = frozenset(rng.sample(names, 4)) if table_jobs else None
            scheduler.add(_job(f"j{i}", Priority.POOL, f"t{i % 4}", 0.5, blocks=blocks), 0.0)
        started = time.perf_counter()
        scheduler.schedule(0.0)
        times.append((time.perf_counter() - started) * 1000.0)
    return {"waiting": n, "table_jobs": table_jobs, "min_ms": min(times), "median_ms": statistics.median(times)}


def run_scheduler_bench(out: Path, seed: int = 0, repeats: int = 7) -> dict:
    report = {
        "fairness": [{"flood": flood, "chunks": 2, "steps_before_b_named": fairness(flood, 2, True),
                      "steps_before_b_one_tenant": fairness(flood, 2, False)} for flood in (1, 4, 16, 64)],
        "reranking": [reranking(40, 12, 3, 6, delay, seed) for delay in (0, 4, 16)],
        "schedule_cost": [schedule_cost(n, t, repeats, seed) for n in (16, 64, 256) for t in (False, True)],
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "scheduler_order.json", report)
    text = _markdown(report)
    (out / "scheduler_order.md").write_text(text)
    _plot(report, out / "scheduler_order.png")
    print(text)
    return report


def _markdown(report: dict) -> str:
    fair = markdown_table(["A's submits (2 steps each)", "steps before B's submit: tenants take turns",
                           "one tenant (rules 1-3 only)"],
                          [[r["flood"], r["steps_before_b_named"], r["steps_before_b_one_tenant"]]
                           for r in report["fairness"]])
    rerank = markdown_table(["max_delay", "block loads", "most overtaken by later arrivals"],
                            [[r["max_delay"], r["block_loads"], r["max_overtaken"]] for r in report["reranking"]])
    cost = markdown_table(["waiting jobs", "table-cache completions", "schedule() min ms", "median ms"],
                          [[r["waiting"], r["table_jobs"], f"{r['min_ms']:.2f}", f"{r['median_ms']:.2f}"]
                           for r in report["schedule_cost"]])
    return ("Fairness (rule 6)\n\n" + fair + "\nReranking (rule 7), 40 completions of 3 of 12 tables, "
            "a tier of 6 blocks\n\n" + rerank + "\nCost of one schedule()\n\n" + cost)


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    floods = [r["flood"] for r in report["fairness"]]
    axes[0].plot(floods, [r["steps_before_b_one_tenant"] for r in report["fairness"]], "o-", label="one tenant")
    axes[0].plot(floods, [r["steps_before_b_named"] for r in report["fairness"]], "o-", label="tenants take turns")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("A's queued submits")
    axes[0].set_ylabel("steps before B's submit runs")
    axes[0].legend()
    delays = [str(r["max_delay"]) for r in report["reranking"]]
    axes[1].bar(delays, [r["block_loads"] for r in report["reranking"]], color="tab:blue")
    axes[1].set_xlabel("rerank max_delay (0 = arrival order)")
    axes[1].set_ylabel("block loads")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out/scheduler"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    run_scheduler_bench(args.out, args.seed, args.repeats)


if __name__ == "__main__":
    main()
