"""Where the KV of a prompt's head comes from: one interface, two sources.

The runtime asks a `PrefixSource` two questions and never which source it is:

    base_state(db, prompt)        P0 (system prompt + schema) for a session to start from
    lookup(db, prompt, ids)       the head of one completion's prompt, as a `PrefixHit`

`P0Source` (here) answers from the P0 store: P0 is prefilled once per
database and shared. The table cache (`headstart.tables.engine_source.
TablePrefixSource`) answers from table blocks: any subset of tables in any
order. The dependency points one way: `headstart.tables` implements this
interface and builds on the engine; the engine never imports the tables.

A `PrefixHit` is lazy: `prepare` runs on the forward worker at the request's
first step (its cost counts in the TTFT, and a table source loads its blocks
only then, so the scheduler's reranking decides which blocks are on the
device when they are needed). `table_blocks` names the table blocks the hit
will place (empty for P0): the scheduler's reranking hint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.kv.p0_store import P0Store, p0_key
from headstart.engine.sched.jobs import Priority
from headstart.engine.sched.extensions import ExtensionSteps
from headstart.prompt import PromptBuilder


@dataclass(frozen=True)
class PrefixHit:
    """The head of one prompt, to be built on the worker.

    prepare: runs on the worker at the request's first step; returns a
        KVState the request owns (it extends it with the rest of the prompt),
        or steps that build one (`sched.extensions.ExtensionSteps`: a table source's
        assembly), whose forwards the request runs as its own rows.
    cached_tokens: about how many prompt tokens `prepare`'s state will hold
        (the scheduler's cost hint; the catch-up rule crops to what matches).
    release: called once when the request finishes, whatever its outcome.
    table_blocks: keys of the table blocks the hit places (the scheduler
        reranks waiting completions by them); empty when there are none.
    """

    prepare: Callable[[], "KVState | ExtensionSteps[KVState]"]
    cached_tokens: int
    release: Callable[[], None] | None = None
    table_blocks: frozenset[str] = frozenset()


@runtime_checkable
class PrefixSource(Protocol):
    """Gives the KV of a prompt's head (see module docstring)."""

    name: str

    def base_state(self, db: str, prompt: PromptBuilder) -> KVState:
        """P0 of `prompt` (shared: callers `share()` it before extending)."""
        ...

    def lookup(self, db: str, prompt: PromptBuilder, prompt_ids: list[int]) -> PrefixHit:
        """The head of `prompt_ids` (a prompt of `prompt`, for database `db`)."""
        ...

    def resident_table_blocks(self) -> frozenset[str]:
        """Keys of the table blocks on the device now (the reranking anchor)."""
        ...

    def close(self) -> None:
        """Free what the source holds (stores, connections)."""
        ...


class P0Source:
    """P0 from the P0 store, prefilled on the worker at a miss and stored.

    Args:
        loaded: the model (`LoadedModel`): its id and dtype key the store.
        runner: its runner: prefills a missing P0; its kernels key the store too.
        worker: the forward worker that prefills a missing P0.
        store: the P0 store (memory LRU + disk).
    """

    name = "p0"

    def __init__(self, loaded, runner: ModelRunner, worker, store: P0Store):
        self.loaded, self.runner, self.worker, self.store = loaded, runner, worker, store

    def base_state(self, db: str, prompt: PromptBuilder) -> KVState:
        # NOTE: the kernels are part of the key: a P0 prefilled by another kernel
        # set differs in float32 rounding, and reusing it would break exactness
        dtype_key = f"{self.loaded.dtype_name}+{self.runner.fast_path}"
        key = p0_key(self.loaded.model_id, dtype_key, prompt.base_ids)
        state = self.store.get(key, self.loaded.device)
        if state is None:
            # a planned row (the scheduler counts its tokens), not an opaque step
            state = self.worker.extend_sync(self.runner, KVState(), prompt.base_ids, Priority.STREAM, "p0",
                                            shared=True)
            self.store.put(key, state)
        return state

    def lookup(self, db: str, prompt: PromptBuilder, prompt_ids: list[int]) -> PrefixHit:
        base = self.base_state(db, prompt)
        return PrefixHit(base.share, base.num_tokens)

    def resident_table_blocks(self) -> frozenset[str]:
        return frozenset()

    def close(self) -> None:
        pass
