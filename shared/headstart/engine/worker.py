"""The forward worker: one thread runs every forward pass, by priority.

All model work of a process goes through one `ForwardWorker`, so a submit is
never stuck behind typing prefill: it waits at most for the step in flight.
A job is a callable that does one bounded step (one prefill chunk, one decode
token) and says whether it has more to do; the worker re-queues it behind the
jobs of its class that were already waiting, so sessions share the device.

TTFT first. A request's decode step (a job whose `decoding()` is true) is
*deferred*: it ranks behind typing prefill (STREAM) until it has waited
`decode_defer_ms`, then takes its class back. A typing step is a future
submit's TTFT; a decode step delayed by one typing forward costs one
inter-token gap, and the bound keeps every stream moving. Prefills of
submits still run before everything but FLASH.

Jobs that name an `owner` (a session, a request) may run as a group: with
`max_batch_rows > 1` the worker takes the most urgent job and the next ready
jobs of other owners, runs their steps together and batches their forward
passes into one (`headstart.engine.batching`). At most one job per owner is
in a group, so no two rows touch one cache. `batch_scope` says which jobs
may share a group: "typing" (this class's default: typing prefill only;
the engine setting defaults to "typing,decode"),
"typing,decode" (typing rows together, and decode steps together in groups
of their own: continuous batching of the answers being streamed),
"typing+decode" (decode steps join typing rows) or "all" (also prefills of
submits and answer-ahead). A submit's prefill runs alone in the first
three: it is the TTFT, and a batched forward costs more than a lone one.

Preemption: a step in flight polls `preempt_requested` between decoder
layers. Typing and answer-ahead steps yield to any more urgent new job; a
decode step yields to a new prefill at least as urgent as its request (a
submit), deferred or not, never to typing. In a group, a row that yields
leaves the batched forward and the others go on; the forward stops when
every row has left (`batching.extend_rows`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from enum import IntEnum
from typing import Callable

from headstart.engine.errors import Cancelled, ResourceExhausted

log = logging.getLogger(__name__)


class Priority(IntEnum):
    """Lower runs first. FLASH (registered questions re-answered on a data
    change) > SUBMIT (a user pressed Enter) > POOL (stateless completions) >
    STREAM (typing prefill, data ingestion) > IDLE (speculative answer-ahead,
    only when nothing else waits)."""

    FLASH = 0
    SUBMIT = 1
    POOL = 2
    STREAM = 3
    IDLE = 4


# Where a deferred decode step ranks: behind typing, ahead of answer-ahead.
DEFERRED_DECODE = Priority.STREAM + 0.5
# "," keeps kinds in groups of their own, "+" lets them share one (module doc).
BATCH_SCOPES = ("typing", "typing,decode", "typing+decode", "all")


class Job:
    """A unit of work on the worker. `step()` returns True while more remains."""

    def __init__(self, step: Callable[[], bool], priority: Priority, name: str = "",
                 order_key: Callable[[], float] | None = None, owner: str | None = None,
                 cost: Callable[[], int] | None = None, decoding: Callable[[], bool] | None = None):
        self.step = step
        # True while the job is a request's decode step (deferrable, see module doc).
        self.decoding = decoding
        self.queued_at = 0.0  # set at each (re)queue: a deferred step's wait counts from here
        self.running_class = float(priority)  # its rank class when it last started (preemption)
        # Whether its next step is a decode step: read from `decoding` when it
        # is (re)queued (only its own step changes it) and used by ranking,
        # batching and preemption alike.
        self.decode_step = False
        # Whose cache the step touches; None: never batched with other jobs.
        self.owner = owner
        # About how many tokens the next step will run through the model (read
        # when a group is formed, so a group fits one forward's token budget).
        self.cost = cost
        # Within a priority class, a smaller key runs first (read at each
        # (re)queue); jobs without one keep arrival order ahead of keyed ones.
        self.order_key = order_key
        self.priority = priority
        self.name = name
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.cancelled = False
        self.steps_run = 0
        # Set by the worker while this job's step runs and a more urgent job
        # arrives; a preemptible step (typing prefill, answer-ahead) polls it
        # between decoder layers, stops, and is queued again.
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


class ForwardWorker:
    """A single thread draining a priority queue of jobs."""

    def __init__(self, max_queued: int = 1024, name: str = "headstart-forward",
                 max_batch_rows: int = 1, max_batch_tokens: int = 64, batch_scope: str = "typing",
                 decode_defer_ms: float = 0.0):
        if batch_scope not in BATCH_SCOPES:
            raise ValueError(f"batch_scope must be one of {BATCH_SCOPES}, not {batch_scope!r}")
        self.max_queued = max_queued
        self.max_batch_rows = max_batch_rows
        self.max_batch_tokens = max_batch_tokens
        self.batch_scope = batch_scope
        self.decode_defer_s = decode_defer_ms / 1000.0
        self._pool = None  # step threads of batched groups, made on first use
        self.batched_groups = 0
        self.batched_forwards = 0
        self.batched_rows = 0
        # (arrival counter, job): ranks change while jobs wait (typing keys,
        # deferral bounds), so the queue is a list ranked afresh at each pop.
        self._queue: list[tuple[int, Job]] = []
        self._counter = itertools.count()
        self._cv = threading.Condition()
        self._stopping = False
        self._running: list[Job] = []
        self.preemptions = 0
        self.busy_seconds = 0.0
        self.steps_run = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def can_enqueue(self) -> bool:
        return len(self._queue) < self.max_queued

    def enqueue(self, step: Callable[[], bool], priority: Priority, name: str = "",
                order_key: Callable[[], float] | None = None, owner: str | None = None,
                cost: Callable[[], int] | None = None, decoding: Callable[[], bool] | None = None) -> Job:
        """Queue a job; raises ResourceExhausted when the queue is full."""
        job = Job(step, priority, name, order_key, owner, cost, decoding)
        with self._cv:
            if self._stopping:
                raise Cancelled("the worker is shutting down")
            if not self.can_enqueue():
                raise ResourceExhausted(f"forward queue full ({self.max_queued} jobs)")
            self._push_locked(job)
            urgent = [r for r in self._running if self._preempts(priority, r)]
            for running in urgent:
                running.preempt_requested = True
            self.preemptions += bool(urgent)
            self._cv.notify()
        return job

    def _push_locked(self, job: Job) -> None:
        job.queued_at = time.perf_counter()
        job.decode_step = self._decoding(job)
        self._queue.append((next(self._counter), job))

    def _pop_group_locked(self) -> list[tuple[Job, tuple]]:
        """The most urgent job and, when it can be batched (`batch_scope`),
        the next ready batchable jobs of other owners in scheduling order, as
        long as their tokens fit `max_batch_tokens`: a group is one forward,
        so a submit that arrives meanwhile waits for one bounded step.

        Every queued job is ranked once, *now*: a queued typing job's key
        changes as its user keeps typing and a deferred decode step takes its
        class back after `decode_defer_ms`. O(queued jobs), a few dozen at
        most per replica. Returns (job, rank) pairs."""
        now = time.perf_counter()
        ranked = sorted(((self._rank(job, counter, now), job) for counter, job in self._queue),
                        key=lambda pair: pair[0])
        first_rank, first = ranked[0]
        group = [(first, first_rank)]
        kind = self._batch_kind(first)
        if self.max_batch_rows > 1 and kind is not None and not first.cancelled:
            owners, tokens = {first.owner}, self._cost(first)
            for rank, job in ranked[1:]:
                if len(group) >= self.max_batch_rows:
                    break
                if job.owner in owners or job.cancelled or self._batch_kind(job) != kind:
                    continue
                cost = self._cost(job)
                if tokens + cost > self.max_batch_tokens:
                    continue  # a smaller job further down may still fit
                group.append((job, rank))
                owners.add(job.owner)
                tokens += cost
        taken = {id(job) for job, _ in group}
        self._queue = [entry for entry in self._queue if id(entry[1]) not in taken]
        return group

    @staticmethod
    def _cost(job: Job) -> int:
        try:
            return max(1, int(job.cost())) if job.cost is not None else 1
        except Exception:  # a hint only: never let it stop the worker
            return 1

    @staticmethod
    def _preempts(priority: Priority, running: Job) -> bool:
        """Whether a new job of `priority` asks `running` to stop (module doc)."""
        cls = running.running_class
        if cls == DEFERRED_DECODE:
            return priority <= Priority.POOL
        if running.decode_step:
            # an overdue decode step still yields to a new prefill at least as
            # urgent as its request: one inter-token gap against a whole TTFT
            return priority <= running.priority
        return cls >= Priority.STREAM and priority < cls

    def _batch_kind(self, job: Job) -> str | None:
        """Which group `job` may join (None: it runs alone). Jobs join only
        groups of their own kind, so with "typing,decode" typing rows (a few
        tokens each) and decode steps (one token) each batch among
        themselves and no decode row is padded to a typing row's length."""
        if job.owner is None:
            return None
        if self.batch_scope == "all":
            return "any"
        if job.priority == Priority.STREAM:
            return "typing" if self.batch_scope != "typing+decode" else "shared"
        if self.batch_scope == "typing" or not job.decode_step:
            return None
        return "decode" if self.batch_scope == "typing,decode" else "shared"

    @staticmethod
    def _decoding(job: Job) -> bool:
        try:
            return job.decoding is not None and bool(job.decoding())
        except Exception:  # a hint only: never let it stop the worker
            return False

    def _deferred(self, job: Job, now: float) -> bool:
        """A decode step of a submit or pool request that has waited less than
        `decode_defer_ms` (FLASH answers are never deferred)."""
        return job.decode_step and job.priority >= Priority.SUBMIT and now - job.queued_at < self.decode_defer_s

    def _rank(self, job: Job, counter: int, now: float) -> tuple:
        """(class, priority, key, arrival): lower runs first."""
        cls = float(job.priority)
        if self._deferred(job, now):
            cls = DEFERRED_DECODE
        key = job.order_key() if job.order_key is not None else 0.0
        return (cls, int(job.priority), key, counter)

    def run_sync(self, fn: Callable[[], object], priority: Priority = Priority.POOL, name: str = ""):
        """Run `fn` once on the worker thread and return its result."""
        box: list = []

        def once() -> bool:
            box.append(fn())
            return False

        self.enqueue(once, priority, name).wait()
        return box[0]

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            pending = [job for _, job in self._queue]
            self._queue.clear()
            self._cv.notify_all()
        for job in pending:
            job.error = Cancelled("the worker shut down")
            job.done.set()
        self._thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                group = self._pop_group_locked()
                for job, rank in group:
                    job.running_class = rank[0]
                self._running = [job for job, _ in group]
            live = []
            for job, rank in group:
                if job.cancelled:
                    job.error = job.error or Cancelled(f"job {job.name!r} was cancelled")
                    job.done.set()
                else:
                    live.append((job, rank))
            started = time.perf_counter()
            if len(live) == 1:
                outcomes = [self._step_alone(live[0][0])]
            elif live:
                outcomes = self._step_group(live)
            else:
                outcomes = []
            self.busy_seconds += time.perf_counter() - started
            with self._cv:
                self._running = []
            for (job, _), (more, error) in zip(live, outcomes):
                self.steps_run += 1
                if error is not None:
                    log.debug("job %s failed: %r", job.name, error)
                    job.error, more = error, False
                else:
                    job.steps_run += 1
                if more and not job.cancelled:
                    with self._cv:
                        job.preempt_requested = False
                        self._push_locked(job)
                else:
                    if job.cancelled and job.error is None and more:
                        job.error = Cancelled(f"job {job.name!r} was cancelled")
                    job.done.set()

    @staticmethod
    def _step_alone(job: Job) -> tuple[bool, BaseException | None]:
        try:
            return job.step(), None
        except BaseException as exc:  # the job's owner re-raises it in wait()
            return False, exc

    def _step_group(self, jobs: list[tuple[Job, tuple]]) -> list[tuple[bool, BaseException | None]]:
        from concurrent.futures import ThreadPoolExecutor

        from headstart.engine.batching import BatchCollector

        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_batch_rows, thread_name_prefix="headstart-step")
        collector = BatchCollector(self._pool, self.max_batch_tokens)
        outcomes = collector.run([(job.step, rank) for job, rank in jobs])
        self.batched_groups += 1
        self.batched_forwards += collector.forwards
        self.batched_rows += collector.rows
        return outcomes
