"""The engine's table-cache paths: P0 from blocks, completions from blocks, precompute jobs.

`EngineRuntime` calls these when its table cache is on:

- `table_base_state`: a session's P0 assembled from blocks instead of
  prefilled. Kept in the P0 store under a key that names the table-cache mode,
  so an assembled P0 and a prefilled one never stand in for each other; a P0
  that had to compute a table (a missing block, the store down) is not kept,
  so the next session tries the blocks again.
- `table_request`: a completion whose cache is assembled from the blocks of
  the tables in its prompt (any order, any subset); the generation request
  then prefills only what follows the last block (the question).
- `precompute_on_worker`: the precompute job, one group per worker step.

Blocks are fetched (store -> device tier) on the calling thread and the
assembly runs on the forward worker, like every forward pass.
"""

from __future__ import annotations

from collections.abc import Callable

from headstart.engine.errors import InvalidInput
from headstart.engine.generation import GenerationRequest, SamplingParams
from headstart.engine.kv import KVState
from headstart.engine.p0_store import p0_key
from headstart.engine.worker import Priority
from headstart.prompt import PromptBuilder
from headstart.tables.precompute import GroupProgress, PrecomputeReport
from headstart.tables.service import LoadedBlocks, TableCacheService


def require_table_cache(runtime) -> TableCacheService:
    """The runtime's table cache service.

    Raises:
        InvalidInput: the table cache is off.
    """
    if runtime.table_cache is None:
        raise InvalidInput("the table cache is off (start the engine with --table-cache pfk|independent)")
    return runtime.table_cache


def table_base_state(runtime, db: str, prompt: PromptBuilder) -> KVState:
    """P0 of `prompt` assembled from table blocks (see module docstring)."""
    service = require_table_cache(runtime)
    loaded = runtime.loaded
    key = p0_key(f"{loaded.model_id}|tables={service.mode}", loaded.dtype_name, prompt.base_ids)
    state = runtime.p0_store.get(key, loaded.device)
    if state is not None:
        return state
    layout = runtime.table_layout(db)
    blocks = service.load(service.plan(layout, prompt.base_ids))
    try:
        state, _ = runtime.worker.run_sync(lambda: service.assemble(blocks, compute_tail=True),
                                           Priority.STREAM, "p0:tables")
    finally:
        service.release(blocks)
    if not blocks.missing:
        runtime.p0_store.put(key, state)
    return state


def table_request(runtime, db: str, prompt: PromptBuilder, prompt_ids: list[int], params: SamplingParams,
                  blocks: LoadedBlocks | None = None) -> GenerationRequest:
    """A generation request whose cache is assembled from table blocks (not yet queued).

    Blocks are loaded after the request is created, so its TTFT counts the
    load; pass `blocks` already loaded (the batch pipeline) to skip that.
    """
    service = require_table_cache(runtime)
    layout = runtime.table_layout(db) if blocks is None else None  # may precompute: before the clock starts
    holder: dict[str, LoadedBlocks] = {}
    request = GenerationRequest(
        runtime.loaded.model, prompt.decode, prompt_ids, params, runtime.stop_ids,
        chunk_tokens=runtime.limits.chunk_tokens,
        prepare=lambda: service.assemble(holder["blocks"], compute_tail=False)[0],
        on_finish=lambda _request: service.release(holder["blocks"]),
    )
    if blocks is None:
        blocks = service.load(service.plan(layout, prompt_ids))
    holder["blocks"] = blocks
    return request


def precompute_on_worker(runtime, db: str, *, skip_existing: bool = True,
                         progress: Callable[[GroupProgress], None] | None = None,
                         priority: Priority = Priority.STREAM) -> PrecomputeReport:
    """Run `db`'s precompute as one worker job, one group per step, and wait for it."""
    service = require_table_cache(runtime)
    layout = service.layout(db, runtime.prompt_for(db))
    steps = service.iter_precompute(layout, skip_existing=skip_existing)
    done: list[GroupProgress] = []

    def step() -> bool:
        item = next(steps, None)
        if item is None:
            return False
        done.append(item)
        if progress is not None:
            progress(item)
        return True

    runtime.worker.enqueue(step, priority, f"precompute:{db}").wait()
    return PrecomputeReport.from_progress(layout, done)
