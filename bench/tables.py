"""`headstart bench tables`: the TableCache paper's Tables 1, 2 and 4 on this machine.

One process, one model, one workload (`tables_workload`: dev questions in
random order, every question listing all its database's tables in a shuffled
order), served back to back, one request at a time, first token only:

- cold: full prefill of every prompt;
- prefix: an exact-prefix radix cache over token ids (`radix_cache`, what
  vLLM / SGLang prefix caching gives), reusing the longest cached prefix;
- pfk: the table cache, blocks encoded per foreign-key group (Redis store,
  device tier LRU, reranking, load/compute pipeline);
- independent: the same with every table encoded alone (paper's "w/o PFTR");
- ablations of pfk (Table 2 and 4): no device tier (every block fetched from
  the store each time), no reranking, no pipeline, LRU vs LFU vs FIFO.

TTFT of the table-cache runs is the service TTFT of `tables.batch` (from the
moment the server is free for a request to its first token, an unhidden load
included); cold and prefix have no loads, so theirs is the request's own.
Blocks are precomputed before any clock starts (a one-time, offline cost,
reported separately). Then the accuracy guard (`tables_guard`) on the first
`guard_questions` questions. Writes tables.json, tables.md and tables.png.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from bench.radix_cache import RadixCache
from bench.tables_guard import run_guard
from bench.tables_report import mode_summary, write_report
from bench.tables_workload import load_schemas, sample_workload
from headstart.config import EngineSettings
from headstart.engine.generation import SamplingParams
from headstart.engine.kv import KVState, extend
from headstart.engine.runtime import EngineRuntime
from headstart.engine.worker import Priority
from headstart.models import load_model
from headstart.tables.batch import BatchItem
from headstart.tables.device_tier import DeviceTier
from headstart.tables.service import TableCacheService
from headstart.tables.store import open_store

ABLATIONS = {  # name -> (mode, device tier bytes or None for the default, policy, rerank, pipeline)
    "no_device_tier": ("pfk", 0, "lru", True, True),
    "no_rerank": ("pfk", None, "lru", False, True),
    "no_pipeline": ("pfk", None, "lru", True, False),
    "lfu": ("pfk", None, "lfu", True, True),
    "fifo": ("pfk", None, "fifo", True, True),
}
FIRST_TOKEN = SamplingParams(max_new_tokens=1)


def run_tables_bench(*, dataset: str = "spider-dev", questions: int = 60, seed: int = 0,
                     model: str = "random:qwen2.5-coder-0.5b", dtype: str = "float32", device: str = "cpu",
                     threads: int | None = 2, store: str = "auto", device_tier_bytes: int = 32 << 20,
                     prefix_cache_bytes: int = 1 << 30, max_delay: int = 16, micro_batch: int = 1,
                     guard_questions: int = 8, guard_tokens: int = 32, out: Path = Path("bench-out/tables")) -> dict:
    """Run the benchmark and write its report (see module docstring); returns the report."""
    if threads:
        torch.set_num_threads(threads)
    settings = EngineSettings(model=model, dtype=dtype, device=device, threads=threads, p0_cache_on_disk=False,
                              table_precompute_on_open=False, table_rerank_max_delay=max_delay)
    loaded = load_model(model, dtype, device, settings.tokenizer_dir, settings.seed)
    runtime = EngineRuntime(settings, loaded)
    with contextlib.ExitStack() as stack:
        store_url = _store_url(store, stack)
        block_store = open_store(store_url)
        stack.callback(block_store.close)
        stack.callback(runtime.shutdown)
        for db, schema in (load_schemas(dataset) or {}).items():
            runtime.register_schema(db, schema)
        workload = sample_workload(dataset, questions, seed, lambda db: runtime.prompt_for(db).schema)
        items = [BatchItem(q.db, q.question, q.tables) for q in workload]
        prompt_tokens = [len(runtime.prompt_for(q.db, q.tables).prompt_ids(q.question)) for q in workload]

        def service(mode: str, tier_bytes: int | None = None, policy: str = "lru") -> TableCacheService:
            capacity = device_tier_bytes if tier_bytes is None else tier_bytes
            return TableCacheService(loaded, mode=mode, store=block_store,
                                     tier=DeviceTier(capacity, policy=policy, device=loaded.device))

        precompute = {mode: _precompute(runtime, service(mode), sorted({q.db for q in workload}))
                      for mode in ("pfk", "independent")}
        _warm_up(runtime, service("pfk"), items[0])
        print(f"\n{len(workload)} questions of {dataset}, store {store_url}", flush=True)
        modes = {"cold": _run_cold(runtime, workload), "prefix": _run_prefix(runtime, workload, prefix_cache_bytes)}
        for mode in ("pfk", "independent"):
            modes[mode] = _run_tables(runtime, service(mode), items, prompt_tokens, mode, True, True, micro_batch)
        ablations = {"lru": dict(modes["pfk"])}
        for name, (mode, tier_bytes, policy, rerank, pipeline) in ABLATIONS.items():
            ablations[name] = _run_tables(runtime, service(mode, tier_bytes, policy), items, prompt_tokens, name,
                                          rerank, pipeline, micro_batch)
        guard_services = {mode: service(mode) for mode in ("pfk", "independent")}
        guard = run_guard(runtime, guard_services, workload[:guard_questions], guard_tokens) if guard_questions else {}
    config = dict(dataset=dataset, questions=len(workload), seed=seed, model=model, dtype=dtype, device=device,
                  threads=threads, store=store_url, device_tier_bytes=device_tier_bytes,
                  prefix_cache_bytes=prefix_cache_bytes, max_delay=max_delay, micro_batch=micro_batch,
                  guard_questions=guard_questions, guard_tokens=guard_tokens,
                  prompt_tokens_mean=sum(prompt_tokens) / len(prompt_tokens))
    report = {"config": config, "modes": modes, "ablations": ablations, "accuracy_guard": guard,
              "precompute": precompute}
    write_report(report, out)
    return report


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
    runtime.table_cache = service
    started = time.perf_counter()
    reports = [runtime.precompute_tables(db) for db in dbs]
    return {"seconds": time.perf_counter() - started, "num_databases": len(dbs),
            "num_tables": sum(r.num_tables for r in reports), "num_groups": sum(r.num_groups for r in reports),
            "num_tokens_encoded": sum(r.num_tokens_encoded for r in reports),
            "num_bytes_stored": sum(r.num_bytes_stored for r in reports)}


def _warm_up(runtime: EngineRuntime, service: TableCacheService, item: BatchItem) -> None:
    """One request per path before the clocks (allocator, kernels, the shared head state)."""
    runtime.table_cache = None
    runtime.complete(item.db, item.question, "cold", 1, tables=item.tables)
    runtime.table_cache = service
    runtime.complete_batch([item], FIRST_TOKEN)


def _run_cold(runtime: EngineRuntime, workload) -> dict:
    runtime.table_cache = None
    ttfts = []
    for q in workload:
        ttfts.append(runtime.start_complete(q.db, q.question, "cold", FIRST_TOKEN, tables=q.tables).result().ttft_ms)
    return mode_summary("cold", ttfts, hit_rate=0.0)


def _run_prefix(runtime: EngineRuntime, workload, max_bytes: int) -> dict:
    """Radix-cache baseline: longest cached prefix reused, the rest computed, then inserted."""
    radix, model = RadixCache(max_bytes), runtime.loaded.model
    ttfts, reused, total = [], 0, 0

    def serve(ids: list[int]) -> tuple[float, int, KVState]:
        start = time.perf_counter()
        match = radix.match(ids)
        state = match.state or KVState()
        n = match.num_tokens
        if n == len(ids):  # the logits after the last token are not cached: recompute it
            n -= 1
            state.crop(n)
        extend(model, state, ids[n:])
        int(torch.argmax(state.last_logits))
        return (time.perf_counter() - start) * 1000.0, n, state

    for q in workload:
        ids = runtime.prompt_for(q.db, q.tables).prompt_ids(q.question)
        ms, n, state = runtime.worker.run_sync(lambda: serve(ids), Priority.POOL, "prefix")
        runtime.worker.run_sync(lambda: radix.insert(ids, state), Priority.POOL, "prefix:insert")
        ttfts.append(ms)
        reused, total = reused + n, total + len(ids)
    return mode_summary("prefix", ttfts, hit_rate=reused / total, cache_bytes=radix.num_bytes,
                        evictions=radix.num_evictions)


def _run_tables(runtime: EngineRuntime, service: TableCacheService, items, prompt_tokens: list[int], name: str,
                rerank: bool, pipeline: bool, micro_batch: int) -> dict:
    runtime.table_cache = service
    results = runtime.complete_batch(items, FIRST_TOKEN, rerank=rerank, pipeline=pipeline, micro_batch=micro_batch)
    stats = service.stats()
    reused = stats["num_block_tokens"] + stats["num_head_tokens"]  # tokens not computed for the request
    return mode_summary(
        name, [r.ttft_ms for r in results], hit_rate=reused / sum(prompt_tokens),
        device_hit_rate=stats["num_device_hits"] / max(stats["num_tables"], 1),
        bytes_from_store=stats["bytes_from_store"], tier_evictions=stats["tier_evictions"],
        missing_blocks=stats["num_misses"], load_ms_total=sum(r.load_ms for r in results),
        rerank=rerank, pipeline=pipeline, policy=service.tier.policy.name,
        device_tier_bytes=service.tier.capacity_bytes,
    )
