"""The forward worker: one thread runs every forward pass, in the scheduler's order.

All model work of a process goes through one `ForwardWorker`, so a submit is
never stuck behind typing prefill: it waits at most for the step in flight.
The loop, all on this one thread:

    plan = scheduler.schedule(now)             # which jobs run (under the lock)
    rows = [job.work.step() for job in plan]   # each prepares its row, no model
    results = run_rows(rows)                   # the runners' packed forwards
    outcomes = [job.work.commit(row, result)]  # each job records its result, says if more
    scheduler.postprocess(plan, outcomes, now) # requeue or finish (under the lock)

*What* runs next is decided only in `sched.scheduler`; this module runs
plans. A plan of several jobs (a group: at most one job per owner, so no
two rows touch one cache) runs their rows as one packed forward; a row
whose job is asked to yield leaves it between decoder layers and the
others go on. Only this thread touches a `KVState`.

Preemption: when a new job arrives, every running job the scheduler says
it preempts gets `preempt_requested`; a preemptible step polls it between
decoder layers, stops, and is queued again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, TypeVar

from headstart.config import default
from headstart.engine.errors import Cancelled, ResourceExhausted
from headstart.engine.kv.state import KVState
from headstart.engine.runner.rows import Row, RowResult
from headstart.engine.sched.extensions import Extension, ExtensionDriver, ExtensionSteps
from headstart.engine.sched.forward_trace import ForwardTrace
from headstart.engine.sched.forwards import run_rows
from headstart.engine.sched.jobs import BatchScope, Call, Job, JobWork, Plan, Priority, StepOutcome
from headstart.engine.sched.scheduler import Scheduler

log = logging.getLogger(__name__)


T = TypeVar("T")


class ForwardWorker:
    """A single thread running the scheduler's plans."""

    # the defaults are the settings' (config.default), as the scheduler's
    def __init__(self, max_queued: int = default("max_queued_jobs"), name: str = "headstart-forward",
                 max_batch_rows: int = default("max_batch_rows"), max_batch_tokens: int = default("max_batch_tokens"),
                 batch_scope: str = default("batch_scope"), decode_defer_ms: float = default("decode_defer_ms"),
                 stream_typing_tokens: int = default("stream_typing_tokens"),
                 rerank_max_delay: int = default("table_rerank_max_delay"),
                 resident_table_blocks: Callable[[], frozenset[str]] = frozenset,
                 trace: "ForwardTrace | None" = None):
        self.scheduler = Scheduler(max_batch_rows, max_batch_tokens, batch_scope, decode_defer_ms / 1000.0,
                                   rerank_max_delay, stream_typing_tokens, resident_table_blocks)
        self.max_queued = max_queued
        self.batched_groups = 0  # plans of more than one row
        # forwards of more than one row, and the rows they ran
        self.batched_forwards = 0
        self.batched_rows = 0
        # tokens the forwards were given, all rows together (prefill chunks and decode steps):
        # the replica's work, which a cancelled request must stop adding to
        self.forward_tokens = 0
        self.shared_tokens = 0  # P0 prefills' (`extend_sync(shared=True)`): the databases', not a client's
        self._cv = threading.Condition()
        self._stopping = False
        self._running: list[Job] = []
        self.preemptions = 0
        self.steps_run = 0
        self.trace = trace  # one JSON line per iteration (`forward_trace`), when set
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # the scheduler's settings, read (and tuned by tests) on the worker
    @property
    def max_batch_rows(self) -> int:
        return self.scheduler.max_batch_rows

    @max_batch_rows.setter
    def max_batch_rows(self, value: int) -> None:
        self.scheduler.max_batch_rows = value

    @property
    def max_batch_tokens(self) -> int:
        return self.scheduler.max_batch_tokens

    @max_batch_tokens.setter
    def max_batch_tokens(self, value: int) -> None:
        self.scheduler.max_batch_tokens = value

    @property
    def batch_scope(self) -> str:
        return self.scheduler.batch_scope.value

    @batch_scope.setter
    def batch_scope(self, value: str) -> None:
        self.scheduler.batch_scope = BatchScope.parse(value)

    @property
    def decode_defer_s(self) -> float:
        return self.scheduler.decode_defer_s

    @decode_defer_s.setter
    def decode_defer_s(self, value: float) -> None:
        self.scheduler.decode_defer_s = value

    def is_alive(self) -> bool:
        """Whether the worker thread runs (a replica's health check)."""
        return self._thread.is_alive()

    def on_worker_thread(self) -> bool:
        """Whether the caller is the worker thread (only it touches a `KVState`)."""
        return threading.current_thread() is self._thread

    @property
    def num_running(self) -> int:
        """Jobs whose steps run in the current iteration."""
        return len(self._running)

    def running_job_names(self) -> list[str]:
        """The names of the jobs in the current iteration (a snapshot)."""
        return [job.name for job in list(self._running)]

    def can_enqueue(self) -> bool:
        return self.scheduler.num_waiting < self.max_queued

    def enqueue(self, work: "JobWork | Callable[[], bool]", priority: Priority, name: str = "",
                owner: str | None = None, tenant: str | None = None, table_blocks: frozenset[str] | None = None,
                background: bool = False, needs_forward: bool = True, apart_from_answers: bool = False) -> Job:
        """Queue a job: its work (a `JobWork`: the step, the commit and the
        scheduler's hints; a plain callable is a `Call`'s step that returns
        no row) and what `Job` lists; raises ResourceExhausted when the
        queue is full. `needs_forward` False: the job's first step runs no
        forward (a submit whose first answer tokens are known), so it stops
        no running step (the scheduler's rule 5). `apart_from_answers`: its
        rows never ride with a streaming answer (rule 2e)."""
        job = Job(work if isinstance(work, JobWork) else Call(work), priority, name, owner)
        job.tenant, job.table_blocks, job.background = tenant, table_blocks, background
        job.needs_forward, job.apart_from_answers = needs_forward, apart_from_answers
        with self._cv:
            if self._stopping:
                raise Cancelled("the worker is shutting down")
            if not self.can_enqueue():
                raise ResourceExhausted(f"forward queue full ({self.max_queued} jobs)")
            self.scheduler.add(job, time.perf_counter())
            urgent = [r for r in self._running if self.scheduler.preempts(priority, r, needs_forward)]
            for running in urgent:
                running.preempt_requested = True
            self.preemptions += bool(urgent)
            self._cv.notify()
        return job

    def run_sync(self, fn: Callable[[], object], priority: Priority = Priority.POOL, name: str = ""):
        """Run `fn` once on the worker thread and return its result."""
        box: list = []

        def once() -> bool:
            box.append(fn())
            return False

        self.enqueue(once, priority, name).wait()
        return box[0]

    def extend_sync(self, runner, state: KVState, ids: list[int], priority: Priority = Priority.STREAM,
                    name: str = "", shared: bool = False) -> KVState:
        """Extend `state` by `ids` (keeping the last logits) as one planned row, and return it
        once done: a forward the scheduler plans and counts (its token cost, the forward trace,
        `forward_tokens`, or `shared_tokens` when `shared`: a cache every request shares, a
        P0), where `run_sync` would hand it an opaque step. The row has no owner, so it is
        never batched: its bits are `runner.extend`'s (a P0 prefill's)."""
        ids = list(ids)

        def one() -> ExtensionSteps[KVState]:
            yield Extension(state, ids)
            return state

        return self.run_steps_sync(runner, one(), priority, name, shared=shared, first_cost=len(ids))

    def run_steps_sync(self, runner, steps: ExtensionSteps[T], priority: Priority = Priority.STREAM,
                       name: str = "", shared: bool = False, first_cost: int = 1) -> T:
        """Run a generator of extensions (`steps.Extension`) on the worker, each forward it
        yields a planned row of one job (`extend_sync`'s accounting), its other steps inline
        between them; return what it returns. `first_cost`: the first forward's tokens, a hint
        (the driver knows the later ones). Its failure is raised here."""
        driver = ExtensionDriver(steps, runner, shared=shared, first_cost=first_cost)
        self.enqueue(driver, priority, name).wait()
        return driver.value

    def withdraw(self, job: Job) -> bool:
        """Cancel a job that is still waiting and take it off the queue now (its owner's state
        it refers to is free at once, not when the worker next plans). True: it will never
        step again; False: it is running (its step in flight finishes) or finished."""
        job.cancel()
        with self._cv:
            withdrawn = self.scheduler.withdraw(job)
        if withdrawn:
            job.done.set()
        return withdrawn

    @property
    def num_queued(self) -> int:
        return self.scheduler.num_waiting

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            pending = self.scheduler.drain()
            self._cv.notify_all()
        for job in pending:
            job.error = Cancelled("the worker shut down")
            job.done.set()
        self._thread.join(timeout)
        if self.trace is not None:
            self.trace.close()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self.scheduler.num_waiting and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                try:
                    plan = self.scheduler.schedule(time.perf_counter())
                except Exception as exc:  # a scheduler bug: fail what waits, never leave callers hanging
                    log.exception("the scheduler failed; failing the %d waiting jobs", self.scheduler.num_waiting)
                    self._fail_all_locked(exc)
                    continue
                self._running = plan.jobs
            for job in plan.dropped:
                job.done.set()
            for job, error in plan.failed:
                log.warning("job %s failed in a scheduling hint: %r", job.name, error)
                job.done.set()
            try:
                outcomes = self._execute(plan)
            except Exception as exc:  # a worker bug: the plan's jobs fail, the worker goes on
                log.exception("the worker failed running a plan of %d jobs", len(plan.planned))
                outcomes = [StepOutcome(False, exc) for _ in plan.planned]
            self.steps_run += len(outcomes)
            with self._cv:
                self._running = []
                finished = self.scheduler.postprocess(plan, outcomes, time.perf_counter())
            for job in finished:
                if job.error is not None:
                    log.debug("job %s failed: %r", job.name, job.error)
                job.done.set()
            # NOTE: not kept while the worker waits for work: a plan holds its jobs (and a dropped
            # job its closed session's cache) until the next one replaces it
            plan = outcomes = finished = job = None

    def _fail_all_locked(self, error: BaseException) -> None:
        for job in self.scheduler.drain():
            job.error = error
            job.done.set()

    def _execute(self, plan: Plan) -> list[StepOutcome]:
        """Prepare every planned job's row, run the rows, commit them."""
        started = time.perf_counter()
        outcomes: list[StepOutcome | None] = []
        rows: list[tuple[int, Job, Row]] = []  # (index in the plan, its job, its row)
        for index, job in enumerate(plan.jobs):
            try:
                out = job.work.step()
            except BaseException as exc:  # the job's owner re-raises it in wait()
                outcomes.append(StepOutcome(False, exc))
                continue
            if isinstance(out, Row):
                rows.append((index, job, out))
                outcomes.append(None)
            else:
                outcomes.append(StepOutcome(bool(out)))
        before = [row.state.num_tokens for _, _, row in rows] if self.trace is not None else []
        forwards: list[int] = []
        forward_s = 0.0
        if rows:
            forward_started = time.perf_counter()
            results, forwards = run_rows([row for _, _, row in rows], self.max_batch_tokens)
            self.forward_tokens += sum(row.num_tokens for _, _, row in rows if not row.shared)
            self.shared_tokens += sum(row.num_tokens for _, _, row in rows if row.shared)
            forward_s = time.perf_counter() - forward_started
            for (index, job, row), result in zip(rows, results):
                outcomes[index] = _commit(job, row, result)
            batched = [n for n in forwards if n > 1]
            self.batched_forwards += len(batched)
            self.batched_rows += sum(batched)
        if len(plan.planned) > 1:
            self.batched_groups += 1
        if self.trace is not None:
            ran = {index: (row.num_tokens, length) for (index, _, row), length in zip(rows, before)}
            self.trace.record(started, time.perf_counter(), forward_s, self.scheduler.num_waiting, len(plan.deferred),
                              [[p.job.name, p.rank.cls.name, p.num_tokens, *ran.get(i, (0, -1))]
                               for i, p in enumerate(plan.planned)], forwards)
        return outcomes  # type: ignore[return-value] (every slot is filled)


def _commit(job: Job, row: Row, result: RowResult) -> StepOutcome:
    """The job's commit of its row's result (worker thread, no worker lock held:
    a commit takes its owner's lock, and owners hold theirs when they enqueue)."""
    try:
        return StepOutcome(bool(job.work.commit(row, result)))
    except BaseException as exc:  # the job's owner re-raises it in wait()
        return StepOutcome(False, exc)
