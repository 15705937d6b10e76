"""The forward worker: one thread runs every forward pass, by priority.

All model work of a process goes through one `ForwardWorker`, so a submit is
never stuck behind typing prefill: it waits at most for the step in flight.
A job is a callable that does one bounded step (one prefill chunk, one decode
token) and says whether it has more to do; the worker re-queues it behind the
jobs of its class that were already waiting, so sessions share the device.
"""

from __future__ import annotations

import heapq
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


class Job:
    """A unit of work on the worker. `step()` returns True while more remains."""

    def __init__(self, step: Callable[[], bool], priority: Priority, name: str = "",
                 order_key: Callable[[], float] | None = None):
        self.step = step
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

    def __init__(self, max_queued: int = 1024, name: str = "headstart-forward"):
        self.max_queued = max_queued
        self._heap: list[tuple[int, float, int, Job]] = []
        self._counter = itertools.count()
        self._cv = threading.Condition()
        self._stopping = False
        self._running: Job | None = None
        self.preemptions = 0
        self.busy_seconds = 0.0
        self.steps_run = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def can_enqueue(self) -> bool:
        return len(self._heap) < self.max_queued

    def enqueue(self, step: Callable[[], bool], priority: Priority, name: str = "",
                order_key: Callable[[], float] | None = None) -> Job:
        """Queue a job; raises ResourceExhausted when the queue is full."""
        job = Job(step, priority, name, order_key)
        with self._cv:
            if self._stopping:
                raise Cancelled("the worker is shutting down")
            if not self.can_enqueue():
                raise ResourceExhausted(f"forward queue full ({self.max_queued} jobs)")
            self._push_locked(job)
            running = self._running
            if running is not None and running.priority >= Priority.STREAM and priority < running.priority:
                running.preempt_requested = True
                self.preemptions += 1
            self._cv.notify()
        return job

    def _push_locked(self, job: Job) -> None:
        order = job.order_key() if job.order_key is not None else 0.0
        heapq.heappush(self._heap, (int(job.priority), order, next(self._counter), job))

    def _pop_locked(self) -> Job:
        """The most urgent job. Within the top priority class, keyed jobs are
        ordered by their key *now* (a queued typing job's key changes as its
        user keeps typing), so the class is rescanned: O(queued jobs)."""
        top = self._heap[0][0]
        best_i, best = 0, None
        for i, (prio, _, counter, job) in enumerate(self._heap):
            if prio != top:
                continue
            rank = (job.order_key() if job.order_key is not None else 0.0, counter)
            if best is None or rank < best:
                best_i, best = i, rank
        job = self._heap[best_i][3]
        self._heap[best_i] = self._heap[-1]
        self._heap.pop()
        heapq.heapify(self._heap)
        return job

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
        return len(self._heap)

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            pending = [job for *_, job in self._heap]
            self._heap.clear()
            self._cv.notify_all()
        for job in pending:
            job.error = Cancelled("the worker shut down")
            job.done.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                job = self._pop_locked()
                self._running = job
            if job.cancelled:
                job.error = job.error or Cancelled(f"job {job.name!r} was cancelled")
                job.done.set()
                continue
            started = time.perf_counter()
            try:
                more = job.step()
                job.steps_run += 1
            except BaseException as exc:  # the job's owner re-raises it in wait()
                log.debug("job %s failed: %r", job.name, exc)
                job.error, more = exc, False
            self.busy_seconds += time.perf_counter() - started
            self.steps_run += 1
            with self._cv:
                self._running = None
            if more and not job.cancelled:
                with self._cv:
                    job.preempt_requested = False
                    self._push_locked(job)
            else:
                if job.cancelled and job.error is None and more:
                    job.error = Cancelled(f"job {job.name!r} was cancelled")
                job.done.set()
