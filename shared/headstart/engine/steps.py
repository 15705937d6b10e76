"""A job's step made explicit: prepare a row, run the rows, commit each result.

A job's `step()` runs on the worker thread and never runs the model. It
either finishes the step at once and returns whether more remains (a step
that needs no forward: answer tokens already known, nothing to extend, or
an opaque step such as `ForwardWorker.run_sync`'s), or returns a `Row`:
the cache to extend, the new token ids, whether to keep the logits after
them, the `should_abort` check polled between decoder layers, and the
`commit` callback that takes the row's result and says whether the job
has more to do.

The worker then hands the plan's rows to their model runner (`run_rows`):
they run as packed forwards (`ModelRunner.extend_rows`, one row or
several), split into forwards that fit the token budget in the plan's
order (the most urgent first).
Rows leave a forward between layers one by one: a row whose `should_abort`
asks is dropped there with its cache untouched and the others go on. Then
`commit_rows` gives every row its `RowResult`, still on the worker thread
and with no lock of the worker held (a commit takes its owner's lock, and
owners hold theirs when they enqueue), and the scheduler's `postprocess`
requeues or finishes each job.

So every `KVState` is touched by the worker thread only, and nothing is
parked on another thread: a group's steps are plain calls in plan order.

Work that interleaves forwards with other steps (a prompt assembled from
table blocks: blocks placed, the spans between them computed) is written as
a generator of `Extension`s: it does its other steps inline and yields each
forward it needs, and returns its result. `ExtensionDriver` turns such a
generator into a job's successive rows (`ForwardWorker.run_steps_sync`, a
request's prepare), so the scheduler plans and counts every one of those
forwards; `run_inline` runs one directly, for callers outside the worker's
plan (the table-cache service's own process, tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, TypeVar

from headstart.engine.kv import KVState
from headstart.engine.model_runner import ModelRunner
from headstart.engine.scheduler_types import JobWork


@dataclass(frozen=True)
class RowResult:
    """What the forward did to a row: `ran` (its cache now holds the new
    ids), or it left the forward between layers (`ran` False, cache as it
    was), or the forward failed (`error`, cache as it was or partly grown:
    the owner must not trust it)."""

    ran: bool
    error: BaseException | None = None


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

    `step()` (the job's step, or a part of a request's) advances the
    generator on first use and returns the row of its pending extension, or
    False once it has returned (its result in `value`). A row's commit
    advances the generator to the next extension (its other steps run there,
    on the worker thread) and always asks for another step, so the owner
    sees `done` at its next step; a failed forward or a raising generator
    fails the job. `cost()`: the pending extension's tokens (the
    scheduler's hint), `first_cost` before the first."""

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
        return Row(self.runner, extension.state, list(extension.ids), True, None, self._commit, shared=self.shared)

    def _advance(self) -> None:
        try:
            self._pending = next(self._steps)
        except StopIteration as stop:
            self._pending, self.done, self.value = None, True, stop.value

    def _commit(self, result: "RowResult") -> bool:
        if result.error is not None:
            raise result.error
        self._advance()
        return True  # the owner's next step sees `done` (or the next row)


@dataclass(eq=False)
class Row:
    """One cache's extension, prepared by a job's step without running the model.

    `runner` is the `ModelRunner` that runs it; the attributes `state`,
    `new_ids`, `want_logits` and `should_abort` are what its `extend_rows`
    and `extend` read. `commit` runs on
    the worker thread after the forward with the row's result and returns
    whether the job has more to do; it may raise to fail its job."""

    runner: ModelRunner
    state: KVState
    new_ids: list[int]
    want_logits: bool
    should_abort: Callable[[], bool] | None
    commit: Callable[[RowResult], bool]
    # the last positions whose logits are kept (a decode step with a draft: all of them), and
    # where the runner puts them [logits_positions, vocab] when more than one
    logits_positions: int = 1
    position_logits: object = None
    # a cache every request shares (a P0): its tokens count in the worker's `shared_tokens`,
    # not in `forward_tokens`, the work clients' own requests cost (issue 29)
    shared: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.new_ids)


def pack_forwards(rows: list[Row], max_tokens: int) -> list[list[Row]]:
    """Split rows (most urgent first) into forwards of at most `max_tokens`
    new tokens each (at least one row per forward), keeping their order.
    A row with no new ids needs no forward and joins none."""
    forwards: list[list[Row]] = []
    current: list[Row] = []
    tokens = 0
    for row in rows:
        if not row.new_ids:
            continue
        if current and (tokens + row.num_tokens > max_tokens or row.runner is not current[0].runner):
            forwards.append(current)
            current, tokens = [], 0
        current.append(row)
        tokens += row.num_tokens
    if current:
        forwards.append(current)
    return forwards


def run_forward(rows: list[Row]) -> list[RowResult]:
    """One forward over `rows` (all of one runner): `ModelRunner.extend_rows`."""
    try:
        done = rows[0].runner.extend_rows(rows)
    except BaseException as exc:  # every row of the forward shares its failure
        return [RowResult(False, exc) for _ in rows]
    return [RowResult(bool(ok)) for ok in done]


def run_rows(rows: list[Row], max_tokens: int) -> tuple[list[RowResult], list[int]]:
    """Run every row (`pack_forwards`, `run_forward`). Returns each row's
    result, in order, and the number of rows in each forward that ran."""
    results: dict[int, RowResult] = {id(row): RowResult(True) for row in rows if not row.new_ids}
    sizes = []
    for forward in pack_forwards(rows, max_tokens):
        sizes.append(len(forward))
        for row, result in zip(forward, run_forward(forward)):
            results[id(row)] = result
    return [results[id(row)] for row in rows], sizes


def commit_rows(rows: list[Row], results: list[RowResult]) -> list[tuple[bool, BaseException | None]]:
    """Give each row its result (`Row.commit`): (more, error) per row."""
    outcomes = []
    for row, result in zip(rows, results):
        try:
            outcomes.append((bool(row.commit(result)), None))
        except BaseException as exc:  # the job's owner re-raises it in wait()
            outcomes.append((False, exc))
    return outcomes

