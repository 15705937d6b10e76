"""The configurations the table-cache benchmark compares, each serving one batch at a time.

Every run keeps its state across batches (the radix tree, the device tier)
and records one TTFT per request:

- `ColdRun`: the engine's cold path, a full prefill per request;
- `PrefixRun`: the radix-cache baseline (`radix_cache`): longest cached
  prefix reused, the rest computed, the prompt inserted after its first token;
- `TableRun`: the engine's table-cache batch path (`tables.batch`) with one
  service (mode, device tier size and policy) and rerank/pipeline switches.
"""

from __future__ import annotations

import time

import torch

from bench.radix_cache import RadixCache
from bench.tables_report import mode_summary
from headstart.engine.requests.generation import SamplingParams
from headstart.engine.kv.state import KVState
from headstart.engine.sched.jobs import Priority
from headstart.tables.batch import BatchItem, serve_batch
from headstart.tables.engine_source import use_table_service

FIRST_TOKEN = SamplingParams(max_new_tokens=1)


class ColdRun:
    name = "cold"

    def __init__(self, runtime) -> None:
        self.runtime, self.ttfts = runtime, []

    def serve(self, batch) -> None:
        use_table_service(self.runtime, None)
        for q in batch:
            request = self.runtime.start_complete(q.db, q.question, "cold", FIRST_TOKEN, tables=q.tables)
            self.ttfts.append(request.result().ttft_ms)

    def summary(self) -> dict:
        return mode_summary(self.name, self.ttfts, hit_rate=0.0)


class PrefixRun:
    name = "prefix"

    def __init__(self, runtime, max_bytes: int) -> None:
        self.runtime, self.radix, self.ttfts = runtime, RadixCache(max_bytes), []
        self.num_reused = self.num_tokens = 0

    def _serve_one(self, ids: list[int]) -> tuple[float, int, KVState]:
        start = time.perf_counter()
        match = self.radix.match(ids)
        state, n = match.state or KVState(), match.num_tokens
        if n == len(ids):  # the logits after the last token are not cached: recompute it
            n -= 1
            state.crop(n)
        self.runtime.runner.extend(state, ids[n:])
        int(torch.argmax(state.last_logits))
        return (time.perf_counter() - start) * 1000.0, n, state

    def serve(self, batch) -> None:
        worker = self.runtime.worker
        for q in batch:
            ids = self.runtime.prompt_for(q.db, q.tables).prompt_ids(q.question)
            ms, n, state = worker.run_sync(lambda: self._serve_one(ids), Priority.POOL, "prefix")
            worker.run_sync(lambda: self.radix.insert(ids, state), Priority.POOL, "prefix:insert")
            self.ttfts.append(ms)
            self.num_reused += n
            self.num_tokens += len(ids)

    def summary(self) -> dict:
        return mode_summary(self.name, self.ttfts, hit_rate=self.num_reused / max(self.num_tokens, 1),
                            cache_bytes=self.radix.num_bytes, evictions=self.radix.num_evictions)


class TableRun:
    def __init__(self, runtime, name: str, service, *, rerank: bool, pipeline: bool, micro_batch: int) -> None:
        self.runtime, self.name, self.service = runtime, name, service
        self.rerank, self.pipeline, self.micro_batch = rerank, pipeline, micro_batch
        self.ttfts, self.load_ms, self.num_tokens = [], 0.0, 0

    def serve(self, batch) -> None:
        use_table_service(self.runtime, self.service)
        items = [BatchItem(q.db, q.question, q.tables) for q in batch]
        results = serve_batch(self.runtime, items, FIRST_TOKEN, rerank=self.rerank, pipeline=self.pipeline,
                                              micro_batch=self.micro_batch)
        self.ttfts += [r.ttft_ms for r in results]
        self.load_ms += sum(r.load_ms for r in results)
        self.num_tokens += sum(r.result.prompt_tokens for r in results)

    def summary(self) -> dict:
        stats, tier = self.service.stats(), self.service.tier
        reused = stats["num_block_tokens"] + stats["num_head_tokens"]  # tokens not computed for the request
        return mode_summary(
            self.name, self.ttfts, hit_rate=reused / max(self.num_tokens, 1),
            device_hit_rate=stats["num_device_hits"] / max(stats["num_tables"], 1),
            bytes_from_store=stats["bytes_from_store"], tier_evictions=stats["tier_evictions"],
            missing_blocks=stats["num_misses"], load_ms_total=self.load_ms, rerank=self.rerank,
            pipeline=self.pipeline, policy=tier.policy.name, device_tier_bytes=tier.capacity_bytes,
        )
