"""`TableCacheService`: the table cache of one engine process.

It ties the model-independent parts (store, device tier, trie) to the model:

    layout(db, prompt)      lay out a database's blocks (token ids, groups, scope, trie); cached
    iter_precompute(layout, runner)  encode and store missing blocks, one group per step  [worker thread]
    warm(layout, runner)    compute the shared head state (else the first request does)  [worker thread]
    warm_steps(layout)      the same as steps: its forward yielded, for the worker to plan
    plan(layout, ids)       find the tables in a prompt (trie), no I/O             [any thread]
    prefetch(plan)          read the blocks the device tier lacks from the store  [any thread]
    load(plan)              get the blocks onto the device tier, pinned            [any thread]
    assemble(loaded, runner, ...)  the prompt's KV cache from blocks + forwards    [worker thread]
    assemble_steps(loaded, model, ...)  the same as steps (`engine.steps.Extension`): every
                            forward yielded, so the engine's worker plans each as a row
    release(loaded)         unpin                                                  [any thread]

`load` never fails a request: a block the store lacks, or cannot serve (Redis
down: the store is a `FallbackStore`), or whose token ids differ from the
prompt, is left out, and `assemble` computes that table with a normal forward
instead. When the device tier cannot take a block (pinned bytes leave no
room, or a capacity of 0), the block is copied to the device for this request
only. Counters for benchmarks and metrics: `stats()`.

Every forward is a `ModelRunner`'s, passed in (the service holds none):
`warm` and `assemble` run its kernels (the engine runs their `_steps` forms,
each forward a row of its worker's plan), so a table-cache prompt matches a
cold prefill run through them; precomputing blocks runs its `encode_rows`
(`tables.precompute`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.sched.extensions import Extension, ExtensionSteps, run_inline
from headstart.models import LoadedModel
from headstart.prompt import PromptBuilder
from headstart.tables.assemble import AssemblyStats, PlacedBlock, assemble_steps
from headstart.tables.device_tier import DeviceTier, TierFullError
from headstart.tables.layout import TableLayout
from headstart.tables.precompute import GroupProgress, PrecomputeReport, iter_precompute
from headstart.tables.store import BlockStore, open_store
from headstart.tables.transfer import BlockTransfer
from headstart.tables.trie import TrieMatch

_COUNTERS = ("num_requests", "num_tables", "num_device_hits", "num_store_hits", "num_misses",
             "bytes_from_store", "num_block_tokens", "num_head_tokens", "num_computed_tokens", "num_forwards")


@dataclass(frozen=True)
class TablePlan:
    """The tables the trie found in one prompt."""

    layout: TableLayout
    prompt_ids: tuple[int, ...]
    match: TrieMatch


@dataclass
class LoadedBlocks:
    """A plan's blocks on the device (pinned ones listed in `pinned`), ready to assemble."""

    plan: TablePlan
    placed: list[PlacedBlock]
    pinned: list[str]
    missing: list[str]
    bytes_from_store: int = 0
    load_seconds: float = 0.0
    released: bool = field(default=False, repr=False)


class TableCacheService:
    """See module docstring. One per engine process and model.

    Args:
        loaded: the model the blocks belong to.
        mode: `pfk` or `independent` (see `layout`).
        store: where blocks live (wrap a remote one in `FallbackStore`: `open_store` does).
        tier: the device tier in front of the store.
        transfer: host -> device copies (overlapping compute on CUDA).
    """

    def __init__(self, loaded: LoadedModel, *, mode: str, store: BlockStore, tier: DeviceTier,
                 transfer: BlockTransfer | None = None) -> None:
        self.loaded, self.mode, self.store, self.tier = loaded, mode, store, tier
        self.transfer = transfer or BlockTransfer(loaded.device)
        self._layouts: dict[str, TableLayout] = {}
        self._used: set[str] = set()
        self._heads: dict[tuple[int, ...], KVState] = {}  # touched on the worker thread only
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(_COUNTERS, 0)

    @classmethod
    def from_settings(cls, settings, loaded: LoadedModel) -> "TableCacheService":
        """Build from `EngineSettings` (`table_*` fields)."""
        transfer = BlockTransfer(loaded.device)
        store = open_store(settings.table_store_url, cpu_tier_bytes=settings.table_cpu_tier_bytes)
        tier = DeviceTier(settings.table_device_bytes, policy=settings.table_eviction, device=loaded.device,
                          transfer=transfer)
        return cls(loaded, mode=settings.table_cache, store=store, tier=tier, transfer=transfer)

    # -- layouts and precompute ---------------------------------------------

    def layout(self, db: str, prompt: PromptBuilder) -> TableLayout:
        """The layout of database `db` from its full-schema prompt (built once per db)."""
        with self._lock:
            layout = self._layouts.get(db)
        if layout is None:
            layout = TableLayout.build(prompt, model_id=self.loaded.model_id, dtype=self.loaded.dtype_name,
                                       mode=self.mode)
            with self._lock:
                layout = self._layouts.setdefault(db, layout)
        return layout

    def claim_first_use(self, db: str) -> bool:
        """True exactly once per database: the caller then precomputes/warms what it needs."""
        with self._lock:
            first = db not in self._used
            self._used.add(db)
            return first

    def missing_tables(self, layout: TableLayout) -> list[str]:
        """Tables whose block the store does not have (a down store has none)."""
        return [t for t in layout.texts if not self.store.contains(layout.scope.block_id(t))]

    def iter_precompute(self, layout: TableLayout, runner: ModelRunner, *, skip_existing: bool = True):
        """Encode and store the layout's groups with `runner` (the model's:
        `loaded.model`), one per step (run on the worker)."""
        return iter_precompute(runner, layout, self.store, skip_existing=skip_existing)

    def precompute(self, layout: TableLayout, runner: ModelRunner, *,
                   skip_existing: bool = True) -> PrecomputeReport:
        """All groups at once (run on the worker); see `iter_precompute`."""
        steps: list[GroupProgress] = list(self.iter_precompute(layout, runner, skip_existing=skip_existing))
        return PrecomputeReport.from_progress(layout, steps)

    # -- serving ---------------------------------------------------------------

    def plan(self, layout: TableLayout, prompt_ids: list[int]) -> TablePlan:
        """Find the layout's tables in a prompt (any order, any subset)."""
        return TablePlan(layout, tuple(prompt_ids), layout.trie.match(prompt_ids))

    def prefetch(self, plan: TablePlan) -> dict[str, object]:
        """The store's copies (host memory; None: the store lacks it) of the
        plan's blocks the device tier does not hold now, by key: the store I/O
        of a later `load`, done on the calling thread, so that `load` on the
        forward worker only admits to the device what it does not find there."""
        out: dict[str, object] = {}
        for span in plan.match.tables:
            block_id = plan.layout.scope.block_id(span.table)
            if block_id.key not in self.tier:
                out[block_id.key] = self.store.get(block_id)
        return out

    def load(self, plan: TablePlan, prefetched: dict[str, object] | None = None) -> LoadedBlocks:
        """Put the plan's blocks on the device, pinned; never raises on a store failure.

        `prefetched` (from `prefetch`): host copies to use instead of reading
        the store; a block neither on the device nor there is read from it."""
        started = time.perf_counter()
        loaded = LoadedBlocks(plan, [], [], [])
        counts = dict.fromkeys(("num_device_hits", "num_store_hits", "num_misses"), 0)
        for span in plan.match.tables:
            block_id = plan.layout.scope.block_id(span.table)
            block = self.tier.get(block_id.key, pin=True)
            if block is not None:
                loaded.pinned.append(block_id.key)
                counts["num_device_hits"] += 1
            else:
                host = prefetched[block_id.key] if prefetched and block_id.key in prefetched \
                    else self.store.get(block_id)
                if host is None or host.token_ids != plan.layout.texts[span.table].ids:
                    loaded.missing.append(span.table)
                    counts["num_misses"] += 1
                    continue
                counts["num_store_hits"] += 1
                loaded.bytes_from_store += host.num_bytes
                block = self._admit(host, loaded)
            loaded.placed.append(PlacedBlock(span.start, block))
        loaded.load_seconds = time.perf_counter() - started
        self._add(num_requests=1, num_tables=len(plan.match.tables), bytes_from_store=loaded.bytes_from_store,
                  **counts)
        return loaded

    def _admit(self, host, loaded: LoadedBlocks):
        if self.tier.can_admit(host.num_bytes):
            try:
                block = self.tier.admit(host, pin=True)
                loaded.pinned.append(host.key)
                return block
            except TierFullError:  # another thread pinned the room between the check and the admit
                pass
        return self.transfer(host)  # on the device for this request only

    def assemble(self, loaded: LoadedBlocks, runner: ModelRunner, *,
                 compute_tail: bool) -> tuple[KVState, AssemblyStats]:
        """The prompt's cache: blocks placed, the rest computed by `runner` here and now
        (`assemble_steps` run inline; on the worker thread, or in a process of its own).

        Args:
            runner: the model's runner (the engine's: its kernels).
            compute_tail: compute the tokens after the last block too (True for
                a P0); False leaves them to the caller (a generation request
                that prefills the question in chunks).
        """
        return run_inline(self.assemble_steps(loaded, runner.model, compute_tail=compute_tail), runner)

    def assemble_steps(self, loaded: LoadedBlocks, model, *,
                       compute_tail: bool) -> ExtensionSteps[tuple[KVState, AssemblyStats]]:
        """`assemble` as steps (`engine.steps.Extension`): each forward (the head's, the spans
        between blocks) yielded for the worker to plan as a row (`ForwardWorker.run_steps_sync`,
        a request's prepare), the rest inline; runs on the worker thread."""
        self.transfer.wait()
        plan = loaded.plan
        head = yield from self._head_steps(plan.layout)
        ids = plan.prompt_ids
        if compute_tail:
            upto = len(ids)
        elif loaded.placed:
            upto = max(p.end for p in loaded.placed)
        else:
            upto = len(head.ids) if head is not None and list(ids[:len(head.ids)]) == head.ids else 0
        state, stats = yield from assemble_steps(model, ids, loaded.placed, head=head, upto=upto)
        self._add(num_block_tokens=stats.num_block_tokens, num_head_tokens=stats.num_head_tokens,
                  num_computed_tokens=stats.num_computed_tokens, num_forwards=stats.num_forwards)
        return state, stats

    def warm(self, layout: TableLayout, runner: ModelRunner) -> None:
        """Compute the layout's head state with `runner` now rather than at the
        first request (`warm_steps` run inline)."""
        run_inline(self.warm_steps(layout), runner)

    def warm_steps(self, layout: TableLayout) -> ExtensionSteps[None]:
        """`warm` as steps: the head's prefill yielded as a forward (none when it is computed)."""
        yield from self._head_steps(layout)

    def release(self, loaded: LoadedBlocks) -> None:
        """Unpin what `load` pinned (idempotent)."""
        if loaded.released:
            return
        loaded.released = True
        for key in loaded.pinned:
            self.tier.unpin(key)

    def _head_steps(self, layout: TableLayout) -> ExtensionSteps[KVState | None]:
        """The layout's shared head state: computed once (one forward, yielded), then kept."""
        if not layout.head_ids:
            return None
        head = self._heads.get(layout.head_ids)
        if head is None:
            head = KVState()
            yield Extension(head, list(layout.head_ids))
            self._heads[layout.head_ids] = head
            self._add(num_forwards=1)
        return head

    # -- counters ---------------------------------------------------------------

    def _add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def stats(self) -> dict[str, int]:
        """Counters since construction or `reset_stats`, plus the device tier's."""
        with self._lock:
            out = dict(self._counts)
        tier = self.tier
        out.update(tier_hits=tier.num_hits, tier_misses=tier.num_misses, tier_evictions=tier.num_evictions,
                   tier_admits=tier.num_admits, tier_used_bytes=tier.used_bytes)
        return out

    def reset_stats(self) -> None:
        with self._lock:
            self._counts = dict.fromkeys(_COUNTERS, 0)

    def close(self) -> None:
        self.store.close()
