"""A row: one cache's extension in a forward, and what the forward did to it.

A job's step prepares a `Row` without running the model; the runner runs
rows (one, or several packed into one forward: `ModelRunner.extend_rows`);
the job's `commit` then gets the row back with its `RowResult`
(`headstart.engine.sched.jobs.JobWork`). The same type serves benchmarks
and tests that call the runner directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from headstart.engine.kv.state import KVState


@dataclass(eq=False)
class Row:
    """Extend `state` by `new_ids`.

    Attributes:
        state: the cache to extend (only the worker thread touches it).
        new_ids: the tokens to run.
        want_logits: keep the logits after the last new token (`state.last_logits`).
        should_abort: polled before each decoder layer; True makes the row leave
            the forward with its state as it was (a newer snapshot, preemption).
        logits_positions: the last positions whose logits are kept; above 1 (a
            decode step with a draft) they go to `position_logits` `# [positions, vocab]`.
        runner: the runner that runs it (the worker packs rows of one runner per
            forward); None when it is handed to a runner directly.
        shared: a cache every request shares (a P0 prefill): the worker counts its
            tokens in `shared_tokens`, apart from the work of clients' requests.
    """

    state: KVState
    new_ids: list[int]
    want_logits: bool = True
    should_abort: Callable[[], bool] | None = None
    logits_positions: int = 1
    position_logits: torch.Tensor | None = None
    runner: object | None = None  # the `ModelRunner` (its module imports this one)
    shared: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.new_ids)


@dataclass(frozen=True)
class RowResult:
    """What the forward did to a row: it `ran` (its state now holds the new
    ids), or it left the forward between layers (`ran` False, state as it
    was), or the forward failed (`error`; the state as it was or partly
    grown: its owner must not trust it)."""

    ran: bool
    error: BaseException | None = None
