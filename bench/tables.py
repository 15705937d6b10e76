"""`headstart bench tables`: the TableCache paper's Tables 1, 2 and 4 on this machine.

One process, one model, one workload (`tables_workload`: dev questions in
random order, every question listing all its database's tables in a shuffled
order), first token only, compared across configurations (`tables_runs`):

- cold: full prefill of every prompt;
- prefix: an exact-prefix radix cache over token ids (`radix_cache`, what
  vLLM / SGLang prefix caching gives), reusing the longest cached prefix;
- pfk: the table cache, blocks encoded per foreign-key group (Redis store,
  device tier LRU, reranking, load/compute pipeline);
- independent: the same with every table encoded alone (paper's "w/o PFTR");
- ablations of pfk (Table 2 and 4): no device tier (every block fetched from
  the store each time), no reranking, no pipeline, LRU vs LFU vs FIFO.

Requests arrive in batches of `batch_size` (the table cache reranks within a
batch, as the paper does). Each batch is served by every configuration in
turn, in an order that rotates from batch to batch (cold and prefix take
turns request by request), each keeping its own state (radix tree, device
tier) across batches: a burst of load from elsewhere on a shared machine then
hits every configuration alike. The whole workload is served `rounds` times,
each round with fresh state; per configuration the report keeps the round
with the least total TTFT (the least disturbed, as `timeit` keeps its best
run) and lists every round's total beside it.

TTFT of the table-cache runs is the service TTFT of `tables.batch` (from the
moment the server is free for a request to its first token, an unhidden load
included); cold and prefix have no loads, so theirs is the request's own.
Blocks (and the shared head state) are computed before any clock starts: a
one-time, offline cost, reported separately. Then the accuracy guard
(`tables_guard`) on the first `guard_questions` questions. Writes
tables.json, tables.md and tables.png.
"""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
import contextlib
import time
from pathlib import Path

import torch

from bench.tables_guard import run_guard
from bench.tables_report import write_report
from bench.tables_runs import FIRST_TOKEN, ColdRun, PrefixRun, TableRun
from bench.tables_workload import load_schemas, sample_workload
from headstart.config import EngineSettings
from headstart.engine.runtime import EngineRuntime
from headstart.engine.sched.jobs import Priority
from headstart.models import load_model
from headstart.tables.batch import BatchItem, serve_batch
from headstart.tables.device_tier import DeviceTier
from headstart.tables.engine_source import use_table_service
from headstart.tables.service import TableCacheService
from headstart.tables.store import open_store

ABLATIONS = {  # name -> (device tier bytes or None for the default, policy, rerank, pipeline)
    "no_device_tier": (0, "lru", True, True),
    "no_rerank": (None, "lru", False, True),
    "no_pipeline": (None, "lru", True, False),
    "lfu": (None, "lfu", True, True),
    "fifo": (None, "fifo", True, True),
}


def run_tables_bench(*, dataset: str = "spider-dev", questions: int = 40, seed: int = 0,
                     model: str = DEFAULT_MODEL, dtype: str = "float32", device: str = "cpu",
                     threads: int | None = 2, store: str = "auto", device_tier_bytes: int = 32 << 20,
                     prefix_cache_bytes: int = 1 << 30, batch_size: int = 20, max_delay: int = 16,
                     micro_batch: int = 1, rounds: int = 2, guard_questions: int = 8, guard_tokens: int = 32,
                     out: Path = Path("bench-out/tables")) -> dict:
    """Run the benchmark and write its report (see module docstring); returns the report."""
    if threads:
        torch.set_num_threads(threads)
    settings = EngineSettings(model=model, dtype=dtype, device=device, threads=threads, p0_cache_on_disk=False,
                              table_precompute_on_open=False, table_rerank_max_delay=max_delay)
    loaded = load_model(model, dtype, device, settings.tokenizer_dir, settings.seed, settings.weights)
    runtime = EngineRuntime(settings, loaded)
    with contextlib.ExitStack() as stack:
        store_url = _store_url(store, stack)
        block_store = open_store(store_url)
        stack.callback(block_store.close)
        stack.callback(runtime.shutdown)
        for db, schema in (load_schemas(dataset) or {}).items():
            runtime.register_schema(db, schema)
        workload = sample_workload(dataset, questions, seed, lambda db: runtime.prompt_for(db).schema)
        dbs = sorted({q.db for q in workload})

        def service(mode: str, tier_bytes: int | None = None, policy: str = "lru") -> TableCacheService:
            capacity = device_tier_bytes if tier_bytes is None else tier_bytes
            svc = TableCacheService(loaded, mode=mode, store=block_store,
                                    tier=DeviceTier(capacity, policy=policy, device=loaded.device))
            layout = svc.layout(dbs[0], runtime.prompt_for(dbs[0]))
            # the head: offline
            runtime.worker.run_steps_sync(runtime.runner, svc.warm_steps(layout), Priority.STREAM, "warm", shared=True)
            return svc

        precompute = {mode: _precompute(runtime, service(mode), dbs) for mode in ("pfk", "independent")}
        _warm_up(runtime, service("pfk"), workload[0])
        print(f"\n{len(workload)} questions of {dataset} in batches of {batch_size}, {rounds} round(s), "
              f"store {store_url}", flush=True)
        summaries = _best([_serve_round(_make_runs(runtime, service, prefix_cache_bytes, micro_batch), workload,
                                        batch_size, r) for r in range(rounds)])
        guard_services = {mode: service(mode) for mode in ("pfk", "independent")}
        guard = run_guard(runtime, guard_services, workload[:guard_questions], guard_tokens) if guard_questions else {}
    modes = {name: summaries[name] for name in ("cold", "prefix", "pfk", "independent")}
    ablations = {"lru": dict(summaries["pfk"]), **{name: summaries[name] for name in ABLATIONS}}
    config = dict(dataset=dataset, questions=len(workload), seed=seed, model=model, dtype=dtype, device=device,
                  threads=threads, store=store_url, device_tier_bytes=device_tier_bytes,
                  prefix_cache_bytes=prefix_cache_bytes, batch_size=batch_size, max_delay=max_delay,
                  micro_batch=micro_batch, rounds=rounds, guard_questions=guard_questions, guard_tokens=guard_tokens,
                  prompt_tokens_mean=sum(len(runtime.prompt_for(q.db, q.tables).prompt_ids(q.question))
                                         for q in workload) / len(workload))
    report = {"config": config, "modes": modes, "ablations": ablations, "accuracy_guard": guard,
              "precompute": precompute}
    write_report(report, out)
    return report


def _make_runs(runtime: EngineRuntime, service, prefix_cache_bytes: int, micro_batch: int) -> list:
    """Fresh configurations (empty radix tree, empty device tiers)."""
    runs = [ColdRun(runtime), PrefixRun(runtime, prefix_cache_bytes)]
    runs += [TableRun(runtime, mode, service(mode), rerank=True, pipeline=True, micro_batch=micro_batch)
             for mode in ("pfk", "independent")]
    for name, (tier_bytes, policy, rerank, pipeline) in ABLATIONS.items():
        runs.append(TableRun(runtime, name, service("pfk", tier_bytes, policy), rerank=rerank, pipeline=pipeline,
                             micro_batch=micro_batch))
    return runs


def _serve_round(runs: list, workload, batch_size: int, round_index: int) -> dict[str, dict]:
    """Every batch through every run, in an order rotating from batch to batch."""
    for k, start in enumerate(range(0, len(workload), batch_size)):
        batch = workload[start:start + batch_size]
        steps = [lambda: _alternate(runs[:2], batch)] + [lambda run=run: run.serve(batch) for run in runs[2:]]
        for step in steps[k % len(steps):] + steps[:k % len(steps)]:
            step()
        print(f"  round {round_index} batch {k}: " +
              "  ".join(f"{r.name} {sum(r.ttfts[start:]) / 1000:.1f}s" for r in runs), flush=True)
    return {run.name: run.summary() for run in runs}


def _best(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Per configuration, the round with the least total TTFT (the one least disturbed by other
    load on a shared machine), with every round's total beside it."""
    best = {}
    for name in rounds[0]:
        totals = [r[name]["total_ttft_s"] for r in rounds]
        pick = min(range(len(rounds)), key=totals.__getitem__)
        best[name] = {**rounds[pick][name], "round": pick, "round_totals_s": totals}
    return best


def _alternate(runs, batch) -> None:
    """Per-request runs served request by request, taking turns to go first."""
    for i, q in enumerate(batch):
        for run in runs if i % 2 == 0 else runs[::-1]:
            run.serve([q])


def _store_url(store: str, stack: contextlib.ExitStack) -> str:
    """`auto`: a private local Redis when a server binary exists, else memory://."""
    if store != "auto":
        return store
    from headstart.redis_server import RedisServerError, local_redis

    try:
        return stack.enter_context(local_redis()).url
    except RedisServerError as exc:
        print(f"no local Redis ({exc}); blocks stay in process memory (memory://)")
        return "memory://"


def _precompute(runtime: EngineRuntime, service: TableCacheService, dbs: list[str]) -> dict:
    use_table_service(runtime, service)
    started = time.perf_counter()
    reports = [runtime.prefix_source.precompute(db) for db in dbs]
    return {"seconds": time.perf_counter() - started, "num_databases": len(dbs),
            "num_tables": sum(r.num_tables for r in reports), "num_groups": sum(r.num_groups for r in reports),
            "num_tokens_encoded": sum(r.num_tokens_encoded for r in reports),
            "num_bytes_stored": sum(r.num_bytes_stored for r in reports)}


def _warm_up(runtime: EngineRuntime, service: TableCacheService, q) -> None:
    """One request per path before the clocks (allocator, kernels)."""
    use_table_service(runtime, None)
    runtime.complete(q.db, q.question, "cold", 1, tables=q.tables)
    use_table_service(runtime, service)
    serve_batch(runtime, [BatchItem(q.db, q.question, q.tables)], FIRST_TOKEN)
