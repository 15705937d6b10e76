"""The objects that cross the scheduler's boundary: priorities, jobs and their
states, ranks and the typed plan of one worker iteration.

A `Job` is the scheduler's unit (nano-vllm's `Sequence`): one bounded step at
a time (a prefill chunk, a decode token) of a session's typing, a request or
an answer-ahead. What it runs, and the hints the scheduler reads of it, are
its `JobWork` (one typed object its owner implements: the job's record);
its `state` changes only in `Scheduler` (see the transition table there);
the worker and the job's owner only read it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Callable, NamedTuple

from headstart.engine.runner.rows import Row, RowResult


class Priority(IntEnum):
    """The scheduler's classes, lower first: the first field of a job's `Rank`
    (rule 1 of `headstart.engine.sched.scheduler`). Integers, in the order they run.

    A job is queued at one of five (its `Job.priority`):

    FLASH: registered questions re-answered on a data change (`data/flash_eval.py`).
    SUBMIT: a user pressed Enter (a session's submit, a data session's query).
    POOL: stateless completions (`EngineRuntime.start_complete`, `tables.batch`).
    STREAM: typing prefill, and the work around it: P0 prefills, table-cache
        assembly, a data session's opening, ingestion and rebuilds (the last
        two `Job.background`).
    IDLE: speculative answer-ahead, only when nothing else waits.

    Two more the scheduler gives a waiting job for a while; no job is queued
    at them:

    DEFERRED_DECODE: a SUBMIT or POOL decode step that has waited less than
        `decode_defer_s` (rule 2): behind typing, ahead of background work
        and answer-ahead; a running one yields to a new POOL-or-higher job
        (rule 5).
    BACKGROUND: a background STREAM job that has waited less than
        `decode_defer_s` (rule 2d): behind deferred decode steps, ahead of
        answer-ahead; a running one yields as a STREAM job does (rule 5).
    """

    FLASH = 0
    SUBMIT = 1
    POOL = 2
    STREAM = 3
    DEFERRED_DECODE = 4
    BACKGROUND = 5
    IDLE = 6


# The classes a job may be queued at (`Job`); the others only the scheduler gives.
QUEUED_CLASSES = frozenset(Priority) - {Priority.DEFERRED_DECODE, Priority.BACKGROUND}


class BatchScope(str, Enum):
    """Which jobs may share one batched forward. "," keeps kinds in groups of
    their own, "+" lets them share one."""

    TYPING = "typing"  # typing prefill rows only
    TYPING_AND_DECODE_APART = "typing,decode"  # typing rows together, decode steps together
    TYPING_WITH_DECODE = "typing+decode"  # decode steps join typing rows
    ALL = "all"  # also prefills of submits and answer-ahead

    @classmethod
    def parse(cls, value: "str | BatchScope") -> "BatchScope":
        try:
            return cls(value)
        except ValueError:
            valid = tuple(s.value for s in cls)
            raise ValueError(f"batch_scope must be one of {valid}, not {value!r}") from None



class BatchKind(str, Enum):
    """The group a job may join; jobs share a forward only with their own kind."""

    TYPING = "typing"
    DECODE = "decode"
    SHARED = "shared"  # typing rows and decode steps together ("typing+decode")
    ANY = "any"  # every owned job ("all")


class JobState(Enum):
    """WAITING (queued) -> RUNNING (its step is in a plan) -> WAITING again when
    the step says more remains, or FINISHED (done, failed or cancelled)."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Rank(NamedTuple):
    """Lower runs first: (class, priority, key within the class, arrival).
    `cls` is the job's priority, or the class the scheduler gives it for now
    (DEFERRED_DECODE, BACKGROUND); `priority` is always the job's own."""

    cls: Priority
    priority: Priority
    key: float
    arrival: int


class JobWork:
    """What a job runs, and what the scheduler reads of it: the job's record.

    The owner of the work subclasses it (a request, a session's typing, its
    answer-ahead, a generator of extensions, a data session's steps); `Call`
    is a one-off call. A `Job` holds one and no callables of its own.

    Both run on the worker thread:
        step: never runs the model. It finishes the step and returns True
            while more remains (False: done), or returns a `Row` to run.
        commit: called with that row and its `RowResult` once the forward
            ran (no worker lock held: a commit takes its owner's lock);
            returns True while more remains, or raises to fail the job.

    The other methods are the scheduler's hints, read on the worker thread
    between steps, where no step of the job runs (a hint that raises fails
    its own job). The defaults are those of work with nothing to say:
        order_key: within a class, a smaller key runs first (read at each
            schedule); None keeps arrival order, ahead of keyed jobs.
        cost: about how many tokens the next step runs through the model
            (read when a group is formed, so a group fits the token budget).
        riding_cost: the same for a typing step whose row rides with
            streaming answers (rule 2c), where it takes less; 0: nothing to
            run then, so it waits. None: not typing work (no cap).
        decoding: whether the next step is a decode step (read at each
            (re)queue: only the job's own step changes it).
    """

    def step(self) -> "Row | bool":
        raise NotImplementedError

    def commit(self, row: Row, result: RowResult) -> bool:
        raise NotImplementedError(f"{type(self).__name__} returned a row but has no commit for it")

    def order_key(self) -> float | None:
        return None

    def cost(self) -> int:
        return 1

    def riding_cost(self) -> int | None:
        return None

    def decoding(self) -> bool:
        return False


class Call(JobWork):
    """A job's work given as its owner's methods: `step` (as `JobWork.step`)
    and, when it returns rows, `commit` (as `JobWork.commit`), with a fixed
    order key and cost: set-up calls, a data session's steps, simulated
    jobs; never a decode step, never typing."""

    def __init__(self, step: Callable[[], "Row | bool"], commit: Callable[[Row, RowResult], bool] | None = None,
                 key: float | None = None, tokens: int = 1):
        self._step, self._commit, self.key, self.tokens = step, commit, key, tokens

    def step(self) -> "Row | bool":
        return self._step()

    def commit(self, row: Row, result: RowResult) -> bool:
        if self._commit is None:
            return super().commit(row, result)
        return self._commit(row, result)

    def order_key(self) -> float | None:
        return self.key

    def cost(self) -> int:
        return self.tokens


class Job:
    """A unit of work on the worker: its `work` (a `JobWork`: the step and
    the hints the scheduler reads) and what the queueing side and the
    scheduler know of it.

    Set by the queueing side before `Scheduler.add` (plain attributes):
        owner: whose cache the step touches; None: never batched.
        tenant: whose work it is (fairness across tenants within a class).
        table_blocks: the keys of the table blocks a table-cache completion
            will place at its first step (reranking); None for every other job.
        background: STREAM work no one waits on (a data session's ingestion
            and rebuilds): a streaming answer's decode step does not wait
            behind it (the scheduler's rule 2d).
        needs_forward: False when the job's first step runs no forward (a
            submit whose first answer tokens are known): it stops no
            running step (rule 5).
        apart_from_answers: its rows never share a forward with a streaming
            answer's decode step (a sampled candidate: rule 2e).
    """

    def __init__(self, work: "JobWork | Callable[[], object]", priority: Priority, name: str = "",
                 owner: str | None = None):
        if priority not in QUEUED_CLASSES:
            valid = ", ".join(p.name for p in Priority if p in QUEUED_CLASSES)
            raise ValueError(f"a job is queued at one of {valid}, not {priority!r}")
        self.work = work if isinstance(work, JobWork) else Call(work)
        self.priority = Priority(priority)
        self.name = name
        self.owner = owner
        self.tenant: str | None = None
        self.table_blocks: frozenset[str] | None = None
        self.background = False
        self.needs_forward = True
        self.apart_from_answers = False
        self.bypassed = 0  # later-arrived table-cache completions started before this one (reranking)
        self.state = JobState.WAITING
        self.arrival = 0  # set by the scheduler at each (re)queue
        self.queued_at = 0.0  # a deferred step's wait counts from here
        self.decode_step = False  # `work.decoding()` as read at the last (re)queue
        self.running_class = self.priority  # its rank class when it last started (preemption)
        # Set by the scheduler for the step it plans now: at most this many new
        # tokens (a typing row riding with answers' decode steps); None: no cap.
        # A step that cannot split its work may ignore it.
        self.token_cap: int | None = None
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.cancelled = False
        self.steps_run = 0
        # Set by the worker while this job's step runs and a more urgent job
        # arrives; a preemptible step (typing prefill, answer-ahead, a decode
        # step for a new submit) polls it between decoder layers and stops.
        self.preempt_requested = False

    def cancel(self) -> None:
        """Drop the job before its next step (the step in flight finishes)."""
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> None:
        """Block until the job finished; re-raise its error."""
        if not self.done.wait(timeout):
            raise TimeoutError(f"job {self.name!r} did not finish in {timeout} s")
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class PlannedJob:
    """One job in a plan, with the rank and token estimate it was planned by."""

    job: Job
    rank: Rank
    num_tokens: int


@dataclass(frozen=True)
class Plan:
    """What one worker iteration runs (`Scheduler.schedule`).

    planned: the jobs whose steps run, most urgent first; the rows their
        steps prepare share one batched forward (`batch_kind` says which
        kind of group; the worker runs them).
    dropped: cancelled jobs taken off the queue (finished as cancelled).
    failed: jobs whose hint raised (finished with that error).
    deferred: decode steps that ranked behind typing this iteration.
    """

    planned: tuple[PlannedJob, ...] = ()
    batch_kind: BatchKind | None = None
    dropped: tuple[Job, ...] = ()
    failed: tuple[tuple[Job, BaseException], ...] = ()
    deferred: tuple[Job, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(p.num_tokens for p in self.planned)

    @property
    def jobs(self) -> list[Job]:
        return [p.job for p in self.planned]


@dataclass(frozen=True)
class StepOutcome:
    """What one planned job's step gave once its row (if any) ran and was
    committed: more work remains, or an error."""

    more: bool
    error: BaseException | None = None
