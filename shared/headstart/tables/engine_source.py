"""The table cache as the engine's prefix source (`headstart.engine.prefix_source`).

`TablePrefixSource` answers the runtime's two questions from table blocks:

- `base_state`: a session's P0 assembled from blocks instead of prefilled.
  Kept in the P0 store under a key that names the table-cache mode, so an
  assembled P0 and a prefilled one never stand in for each other; a P0 that
  had to compute a table (a missing block, the store down) is not kept, so
  the next session tries the blocks again.
- `lookup`: a completion's head, assembled from the blocks of the tables in
  its prompt (any order, any subset); the generation request then prefills
  only what follows the last block (the question). The store is read on the
  calling thread at lookup (for the blocks the device tier lacks then: the
  forward worker does no store I/O); the blocks are admitted to the device
  tier, pinned, and assembled on the forward worker at the request's first
  step, so the scheduler's reranking of waiting completions
  (`headstart.engine.sched.ordering`) decides which blocks are on the
  device when they are needed; the TTFT counts both.

It also owns the table cache's own work: a database's layout (precomputing
missing blocks and warming the shared head at first use) and the precompute
job, one group per worker step. The dependency is one way: this package
builds on the engine; the engine knows only the `PrefixSource` interface.
"""

from __future__ import annotations

from collections.abc import Callable

from headstart.engine.errors import InvalidInput
from headstart.engine.kv.state import KVState
from headstart.engine.kv.p0_store import p0_key
from headstart.engine.prefix_source import PrefixHit
from headstart.engine.sched.jobs import Priority
from headstart.engine.sched.extensions import ExtensionSteps
from headstart.prompt import PromptBuilder
from headstart.tables.layout import TableLayout
from headstart.tables.precompute import GroupProgress, PrecomputeReport
from headstart.tables.service import LoadedBlocks, TableCacheService, TablePlan


class TablePrefixSource:
    """Prompt heads from table blocks (see module docstring).

    Args:
        runtime: the `EngineRuntime` it serves (its worker, P0 store, prompts, settings).
        service: the table cache of this process.
    """

    name = "tables"

    def __init__(self, runtime, service: TableCacheService):
        self.runtime, self.service = runtime, service

    # -- the prefix-source interface ---------------------------------------------

    def base_state(self, db: str, prompt: PromptBuilder) -> KVState:
        runtime, service = self.runtime, self.service
        loaded = runtime.loaded
        key = p0_key(f"{loaded.model_id}|tables={service.mode}", loaded.dtype_name, prompt.base_ids)
        state = runtime.p0_store.get(key, loaded.device)
        if state is not None:
            return state
        layout = self.layout(db)
        blocks = service.load(service.plan(layout, prompt.base_ids))
        try:
            # every forward of the assembly (the head, the spans between blocks) a planned row
            state, _ = runtime.worker.run_steps_sync(
                runtime.runner, service.assemble_steps(blocks, runtime.runner.model, compute_tail=True),
                Priority.STREAM, "p0:tables", shared=True, first_cost=len(prompt.base_ids))
        finally:
            service.release(blocks)
        if not blocks.missing:
            runtime.p0_store.put(key, state)
        return state

    def lookup(self, db: str, prompt: PromptBuilder, prompt_ids: list[int]) -> PrefixHit:
        plan = self.service.plan(self.layout(db), prompt_ids)
        return self.hit(plan, prefetched=self.service.prefetch(plan))

    def resident_table_blocks(self) -> frozenset[str]:
        return frozenset(self.service.tier.keys())

    def close(self) -> None:
        self.service.close()

    # -- hits ----------------------------------------------------------------------

    def hit(self, plan: TablePlan, loaded: LoadedBlocks | None = None,
            prefetched: dict[str, object] | None = None) -> PrefixHit:
        """The head of `plan`'s prompt: its blocks loaded (from `prefetched`
        host copies where the device lacks them) and assembled at the
        request's first step, or `loaded` already (the batch pipeline)."""
        service, runner = self.service, self.runtime.runner
        holder: dict[str, LoadedBlocks] = {} if loaded is None else {"blocks": loaded}

        def prepare() -> ExtensionSteps[KVState]:  # steps: the request plans each forward as its row
            if "blocks" not in holder:
                holder["blocks"] = service.load(plan, prefetched)
                if prefetched:
                    prefetched.clear()  # the host copies are on the device now (or not needed)
            state, _ = yield from service.assemble_steps(holder["blocks"], runner.model, compute_tail=False)
            return state

        def release() -> None:
            if "blocks" in holder:
                service.release(holder["blocks"])

        return PrefixHit(prepare, cached_tokens(plan), release, block_keys(plan))

    # -- the table cache's own work -------------------------------------------------

    def layout(self, db: str) -> TableLayout:
        """The table layout of `db`; the first call precomputes missing blocks when configured."""
        runtime, service = self.runtime, self.service
        layout = service.layout(db, runtime.prompt_for(db))
        first = service.claim_first_use(db)
        if first and runtime.settings.table_precompute_on_open and service.missing_tables(layout):
            self.precompute(db)
        if first:
            runtime.worker.run_steps_sync(runtime.runner, service.warm_steps(layout), Priority.STREAM, "tables:head",
                                          shared=True, first_cost=len(layout.head_ids))
        return layout

    def precompute(self, db: str, *, skip_existing: bool = True,
                   progress: Callable[[GroupProgress], None] | None = None,
                   priority: Priority = Priority.STREAM) -> PrecomputeReport:
        """Encode and store `db`'s table blocks as one worker job, one group per
        step, and wait for it; `progress` is called with each `GroupProgress`."""
        layout = self.service.layout(db, self.runtime.prompt_for(db))
        steps = self.service.iter_precompute(layout, self.runtime.runner, skip_existing=skip_existing)
        done: list[GroupProgress] = []

        def step() -> bool:
            item = next(steps, None)
            if item is None:
                return False
            done.append(item)
            if progress is not None:
                progress(item)
            return True

        self.runtime.worker.enqueue(step, priority, f"precompute:{db}").wait()
        return PrecomputeReport.from_progress(layout, done)


def block_keys(plan: TablePlan) -> frozenset[str]:
    """The keys of the blocks `plan` places (the scheduler's reranking hint)."""
    return frozenset(plan.layout.scope.block_id(t).key for t in plan.match.table_names)


def cached_tokens(plan: TablePlan) -> int:
    """Prompt tokens an assembly of `plan` holds when every block is there (a cost hint)."""
    if plan.match.tables:
        return max(span.end for span in plan.match.tables)
    head = plan.layout.head_ids
    return len(head) if head and tuple(plan.prompt_ids[:len(head)]) == tuple(head) else 0


def table_source(runtime) -> TablePrefixSource:
    """The runtime's table prefix source.

    Raises:
        InvalidInput: the table cache is off.
    """
    source = runtime.prefix_source
    if not isinstance(source, TablePrefixSource):
        raise InvalidInput("the table cache is off (start the engine with --table-cache pfk|independent)")
    return source


def use_table_service(runtime, service: TableCacheService | None) -> None:
    """Serve `runtime`'s prompt heads from `service`'s blocks (None: from its P0
    store again); benchmarks switch one runtime between paths with it."""
    runtime.prefix_source = runtime.p0_source if service is None else TablePrefixSource(runtime, service)
