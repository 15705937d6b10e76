"""Cross-session batching: one forward pass over many sessions' extensions.

On a device whose forward pass is bound by reading the weights (a CPU, or a
GPU at small token counts), one pass over 8 sessions' few new tokens costs
about as much as one pass over one session's. So the worker runs a *group*
of ready jobs of one kind at once (typing prefill rows together and decode
steps together by default; `ForwardWorker.batch_scope` says which; at most
one job per owner, so no two rows share a cache) and their forward passes
meet here:

* `BatchCollector` runs each job's step on its own thread. The step code is
  unchanged: when it calls `kv.extend`, the call is parked here instead of
  running. When every step of the group has either parked a call or returned,
  the collector runs the parked calls as one packed forward
  (`model_runner.extend_rows`: each row attends to its own cache in place,
  nothing is copied into a padded batch), hands each its result and lets the
  steps go on. Steps that park a second call meet again in a next round.

* Rows leave a forward between decoder layers. Each row's `should_abort`
  is polled before every layer; a row that asks (a newer snapshot made it
  useless, or a more urgent job arrived) is dropped from the batch there
  and its state is left as it was, and the other rows go on, smaller. So
  when a submit arrives while its own session's typing row is in a group,
  the other rows yield and that row finishes at a lone row's cost, instead
  of the submit waiting for the whole group. When every row asks, the
  forward stops.

Exactness: see `headstart.engine.model_runner`; a group of one job runs the
lone path unchanged.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from headstart.engine import collector_slot
from headstart.engine import kv as kv_module
from headstart.engine.kv import KVState
from headstart.engine.model_runner import extend_rows, supports_packed_rows


@dataclass
class ParkedCall:
    """An `extend` call waiting for the group's next forward."""

    model: object
    state: KVState
    new_ids: list[int]
    want_logits: bool
    should_abort: Callable[[], bool] | None
    rank: tuple  # the job's scheduling rank: lower runs in an earlier forward when over budget
    done: threading.Event = field(default_factory=threading.Event)
    result: bool | None = None
    error: BaseException | None = None


class BatchCollector:
    """Runs one group of job steps with their forwards batched (see module doc).

    `run(steps)` returns, per step, `(more, error)` as a lone step would."""

    def __init__(self, pool, max_batch_tokens: int):
        self.pool = pool
        self.max_batch_tokens = max_batch_tokens
        self._cv = threading.Condition()
        self._parked: list[ParkedCall] = []
        self._running = 0
        self.forwards = 0
        self.rows = 0

    # -- step threads --------------------------------------------------------

    def extend(self, model, state: KVState, new_ids: list[int], want_logits: bool,
               should_abort: Callable[[], bool] | None) -> bool:
        """`kv.extend` on a step thread of this group: wait for the batched forward."""
        call = ParkedCall(model, state, new_ids, want_logits, should_abort, collector_slot.active_rank())
        with self._cv:
            self._parked.append(call)
            self._running -= 1
            self._cv.notify_all()
        call.done.wait()  # the worker counted us as running again before waking us
        if call.error is not None:
            raise call.error
        return bool(call.result)

    def _run_step(self, step: Callable[[], bool], rank: tuple):
        collector_slot.enter(self, rank)
        try:
            return step(), None
        except BaseException as exc:  # reported like a lone step's failure
            return False, exc
        finally:
            collector_slot.leave()
            with self._cv:
                self._running -= 1
                self._cv.notify_all()

    # -- the worker thread -----------------------------------------------------

    def run(self, steps: list[tuple[Callable[[], bool], tuple]]) -> list[tuple[bool, BaseException | None]]:
        with self._cv:
            self._running = len(steps)
        futures = [self.pool.submit(self._run_step, step, rank) for step, rank in steps]
        while True:
            with self._cv:
                # every step has either parked a call or returned
                self._cv.wait_for(lambda: self._running == 0)
                if not self._parked:
                    break
                batch = self._take_batch_locked()
            self._forward(batch)
        return [f.result() for f in futures]

    def _take_batch_locked(self) -> list[ParkedCall]:
        """The parked calls of the most urgent jobs, within the token budget
        (always at least one); the rest wait for the next forward."""
        self._parked.sort(key=lambda c: c.rank)
        batch, tokens = [], 0
        for call in self._parked:
            if batch and tokens + len(call.new_ids) > self.max_batch_tokens:
                break
            batch.append(call)
            tokens += len(call.new_ids)
        del self._parked[: len(batch)]
        return batch

    def _forward(self, batch: list[ParkedCall]) -> None:
        self.forwards += 1
        self.rows += len(batch)
        try:
            if len(batch) > 1 and supports_packed_rows(batch[0].model):
                results = extend_rows(batch[0].model, batch)
            else:  # the worker thread has no collector: these are lone extensions
                results = [kv_module.extend(call.model, call.state, call.new_ids, call.want_logits,
                                            call.should_abort) for call in batch]
            for call, ok in zip(batch, results):
                call.result = ok
        except BaseException as exc:
            for call in batch:
                call.error = exc
        with self._cv:  # counted before they wake, so the next rendezvous waits for them
            self._running += len(batch)
        for call in batch:
            call.done.set()
