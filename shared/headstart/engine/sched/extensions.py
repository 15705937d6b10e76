"""Work that interleaves forwards with other steps, as a generator of extensions.

A prompt assembled from table blocks places blocks and computes the spans
between them; a P0 prefill is one forward. Such work is written as a
generator that does its other steps inline and yields an `Extension` for
each forward it needs, then returns its result. `ExtensionDriver` makes
each yielded extension a row of one job (`ForwardWorker.run_steps_sync`, or
a request's first steps: `GenerationRequest`'s `prepare`), so the scheduler
plans and counts every one of those forwards; `run_inline` runs the
generator directly, for callers outside the worker's plan (the table-cache
service's own process, tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, TypeVar

from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row, RowResult
from headstart.engine.sched.jobs import JobWork

T = TypeVar("T")


@dataclass(frozen=True)
class Extension:
    """A forward a generator of steps needs: extend `state` by `ids`, keeping the last logits."""

    state: KVState
    ids: list[int]


ExtensionSteps = Generator[Extension, None, T]


def run_inline(steps: "ExtensionSteps[T]", runner: ModelRunner) -> T:
    """Run a generator of extensions to its end, each by `runner.extend` here and now; its result."""
    try:
        extension = next(steps)
        while True:
            runner.extend(extension.state, list(extension.ids))
            extension = next(steps)
    except StopIteration as stop:
        return stop.value


class ExtensionDriver(JobWork):
    """A generator of extensions as one job's rows, on the worker thread.

    `step()` advances the generator on first use and returns the row of its
    pending extension, or False once it has returned (its result in
    `value`). `commit` advances the generator to the next extension (its
    other steps run there) and always asks for another step, so the owner
    sees `done` at its next step; a failed forward or a raising generator
    fails the job. `cost()`: the pending extension's tokens, `first_cost`
    before the first."""

    def __init__(self, steps: "ExtensionSteps", runner: ModelRunner, *, shared: bool = False, first_cost: int = 1):
        self._steps, self.runner, self.shared = steps, runner, shared
        self._pending: Extension | None = None
        self._started = False
        self._first_cost = max(1, first_cost)
        self.done = False
        self.value = None

    def cost(self) -> int:
        return len(self._pending.ids) if self._pending is not None else self._first_cost

    def step(self) -> "Row | bool":
        if not self._started:
            self._started = True
            self._advance()
        if self.done:
            return False
        extension = self._pending
        return Row(extension.state, list(extension.ids), runner=self.runner, shared=self.shared)

    def commit(self, row: Row, result: RowResult) -> bool:
        if result.error is not None:
            raise result.error
        self._advance()
        return True  # the owner's next step sees `done` (or the next row)

    def _advance(self) -> None:
        try:
            self._pending = next(self._steps)
        except StopIteration as stop:
            self._pending, self.done, self.value = None, True, stop.value
