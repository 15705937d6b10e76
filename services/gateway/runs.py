"""Runs (`/v1/execute`) in worker processes at a lower CPU priority.

A heavy Run is CPU-bound SQLite work. On threads of the gateway it shares the
GIL with the event loop that serves every tenant: SQLite's progress handler
(the deadline check) takes the GIL about every millisecond in each Run
thread, and a niced thread preempted while holding it stalls the loop behind
it (priority inversion). In processes of their own, at the idle CPU
priority, Runs can only
slow other Runs; the loop keeps its GIL (issue 16, `bench/gateway_loop_lag.py`).

Results are bounded (rows, bytes per cell and in total), so shipping them
back is cheap. Workers start on first use and are reused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
from pathlib import Path

from headstart.client.errors import ApiError
from services.gateway.databases import RunLimits, run_read_only

RUN_NICENESS = 10
# The worker enforces a Run's deadline itself (SQLite's progress handler,
# counted from when the Run starts). The caller gives up only on a worker that
# is wedged: this much past the deadline, which leaves room for a worker's
# start-up (a fresh interpreter, seconds on a loaded machine) and a queue.
DEADLINE_GRACE_S = 60.0


def _lower_priority() -> None:
    """SCHED_IDLE where Linux allows it (the worker runs only on CPU time nothing
    else wants: a waking event loop or engine always preempts it), else nice 10.

    NOTE: safe only in a process of its own: a SCHED_IDLE *thread* holding
    the GIL could starve the loop that waits for it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.nice(RUN_NICENESS)
    except (AttributeError, OSError):  # not permitted: run at normal priority
        pass


def _warm(_: int = 0) -> int:
    return os.getpid()


def _run_in_worker(path: str, sql: str, limits: RunLimits) -> tuple[str, object]:
    """Worker side: ("ok", result) or ("error", (code, message)); ApiError is not sent as an exception
    (its constructor does not round-trip through pickle)."""
    try:
        return "ok", run_read_only(Path(path), sql, limits)
    except ApiError as exc:
        return "error", (exc.code, exc.message)


class RunPool:
    """A lazily started pool of `max_workers` niced processes for Runs."""

    def __init__(self, max_workers: int):
        self.max_workers = max_workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            # NOTE: forkserver, not fork: the gateway process has threads (gRPC,
            # uvicorn) and forking those is unsafe.
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__])  # each worker forks with this module imported
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.max_workers, mp_context=context, initializer=_lower_priority)
        return self._pool

    async def run(self, path: Path, sql: str, limits: RunLimits) -> dict:
        """`run_read_only(path, sql, limits)` in a worker; raises its ApiError (CANCELLED past the deadline)."""
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor(), _run_in_worker, str(path), sql, limits)
            status, value = await asyncio.wait_for(future, limits.timeout_s + DEADLINE_GRACE_S)
        except (asyncio.TimeoutError, TimeoutError):
            raise ApiError("CANCELLED", f"the Run did not end within {limits.timeout_s:g} s") from None
        except concurrent.futures.process.BrokenProcessPool:
            self._pool = None  # a worker died (killed, out of memory): the next Run gets a fresh pool
            raise ApiError("UNAVAILABLE", "the Run's worker died; try again") from None
        if status == "error":
            code, message = value
            raise ApiError(code, message)
        return value

    def warm(self) -> None:
        """Start every worker now (benchmarks: keep process start-up out of the measurement)."""
        list(self._executor().map(_warm, range(self.max_workers)))

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
