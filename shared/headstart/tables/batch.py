"""Serve a batch of table-cache completions: rerank, then load one micro-batch ahead.

The paper's batch path (sections 4.2.1 and 4.2.2):

1. find each request's tables with the trie;
2. rerank the requests so consecutive ones share tables (`rerank.rerank`,
   anchored on the blocks already on the device, never delaying a request
   more than `max_delay` places);
3. cut the order into micro-batches and run them through the load/compute
   pipeline (`pipeline.iter_pipeline`): while micro-batch i computes on the
   forward worker, a loader thread fetches micro-batch i+1's blocks from the
   store and admits them to the device tier.

TTFT here is the *service* TTFT: from the moment the server is free for a
request (the previous request finished, or the batch started) to its first
token, so a load the pipeline did not hide is counted, and queueing behind
earlier requests of the batch is not. Summed over the batch it is the
paper's "total TTFT".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from headstart.engine.requests.generation import SamplingParams, SubmitResult
from headstart.engine.sched.jobs import Priority
from headstart.tables.pipeline import iter_pipeline
from headstart.tables.engine_source import table_source
from headstart.tables.rerank import rerank as rerank_order


@dataclass(frozen=True)
class BatchItem:
    """One completion: a question over `tables` of `db` in that order (all tables when None)."""

    db: str
    question: str
    tables: tuple[str, ...] | None = None


@dataclass(frozen=True)
class BatchResult:
    """One served item: `index` in the batch, `position` in the serving order."""

    index: int
    position: int
    result: SubmitResult
    ttft_ms: float
    load_ms: float
    tables: tuple[str, ...]
    missing: tuple[str, ...]
    bytes_from_store: int


def serve_batch(runtime, items: list[BatchItem], params: SamplingParams = SamplingParams(), *,
                rerank: bool = True, max_delay: int | None = None, pipeline: bool = True,
                micro_batch: int = 1, priority: Priority = Priority.POOL) -> list[BatchResult]:
    """Serve `items` (see module docstring); results in the order of `items`.

    Args:
        rerank: reorder for table reuse; False serves in arrival order.
        max_delay: reranking's starvation bound (default: the settings').
        pipeline: load micro-batch i+1 while i computes; False loads each just before computing it.
        micro_batch: requests per micro-batch.
    Raises:
        ValueError: micro_batch < 1.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    source = table_source(runtime)
    service = source.service
    prepared = []
    for item in items:
        prompt = runtime.prompt_for(item.db, item.tables)
        ids = prompt.prompt_ids(item.question)
        prepared.append((item, prompt, ids, service.plan(source.layout(item.db), ids)))
    keys = [{plan.layout.scope.block_id(t).key for t in plan.match.table_names} for *_, plan in prepared]
    if rerank:
        delay = runtime.settings.table_rerank_max_delay if max_delay is None else max_delay
        order = rerank_order(keys, max_delay=delay, anchor=set(service.tier.keys()))
    else:
        order = list(range(len(items)))
    batches = [order[i:i + micro_batch] for i in range(0, len(order), micro_batch)]
    results: list[BatchResult] = []
    clock = {"free_at": time.perf_counter()}

    def load(batch: list[int]):
        return [service.load(prepared[i][3]) for i in batch]

    def compute(batch: list[int], loaded) -> None:
        for i, blocks in zip(batch, loaded):
            item, prompt, ids, _ = prepared[i]
            request = runtime.start_from_hit(prompt, ids, params, source.hit(blocks.plan, blocks), priority,
                                             f"tables-batch:{item.db}")
            result = request.result()
            ttft_ms = (request.first_token_at - clock["free_at"]) * 1000.0
            clock["free_at"] = request.finished_at
            results.append(BatchResult(i, len(results), result, ttft_ms, blocks.load_seconds * 1000.0,
                                       blocks.plan.match.table_names, tuple(blocks.missing), blocks.bytes_from_store))

    def discard(_batch: list[int], loaded) -> None:
        for blocks in loaded:
            service.release(blocks)

    if pipeline:
        for _ in iter_pipeline(batches, load, compute, discard=discard):
            pass
    else:
        for batch in batches:
            loaded = load(batch)
            try:
                compute(batch, loaded)
            except BaseException:
                discard(batch, loaded)
                raise
    return sorted(results, key=lambda r: r.index)
