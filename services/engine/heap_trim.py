"""Giving a replica's freed heap pages back to the system once its work pauses (issues 14, 32).

A replica's forwards allocate and free activations all the time, and
sessions come and go: blocks of many sizes are freed, and glibc keeps them
(`headstart.heap`), so the resident size after a burst of work stays 40-50
MiB above the bytes in use (the 0.5B served quantized, 8 sessions:
docs/benchmarks.md, "Replica RSS"). `malloc_trim(0)` gives them back, but
takes the arenas' locks and the next forwards fault the pages in again (at
a 2 s period, 8 typists' complete SQL took a fifth longer), so the replica calls it
only when its forward worker is idle, only after forward work ran since the
last trim (an idle replica has nothing new to give back), and at most every
`HEADSTART_MALLOC_TRIM_S` seconds. A thread of the replica polls for that
moment (`poll_s`), so the pages go back within a fraction of a second of a
burst's end. The same moment gives back the pages of free KV blocks
(`headstart.engine.kv.block_pool.give_back_free_pages`): the pool's slabs are
live allocations that `malloc_trim` cannot shrink.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from headstart.engine.kv.block_pool import give_back_free_pages
from headstart.heap import libc_malloc_trim

log = logging.getLogger(__name__)

__all__ = ["HeapTrimmer", "libc_malloc_trim"]


class HeapTrimmer:
    """Calls `malloc_trim(0)` when the replica is idle, forward work ran since the last call, and
    `period_s` has passed since it (period 0, or no glibc: never)."""

    def __init__(self, period_s: float, trim: Callable[[int], int] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if period_s < 0:
            raise ValueError("period_s must be >= 0")
        self.period_s = period_s
        self._trim = trim if trim is not None else (libc_malloc_trim() if period_s else None)
        self._clock = clock
        self._last = clock()
        self._work_at_last: int | None = None
        self.num_trims = 0
        self._stop = threading.Event()

    @property
    def enabled(self) -> bool:
        return self.period_s > 0 and self._trim is not None

    def maybe_trim(self, idle: bool, work: int | None = None) -> bool:
        """Trim now if enabled, `idle` (no forward work queued or running), due, and `work` (a count
        of forward steps run, None: not counted) moved since the last trim; returns whether it did.

        NOTE: a busy replica is not trimmed: the pages it frees now it will likely take again at
        the next step."""
        now = self._clock()
        if not self.enabled or not idle or now - self._last < self.period_s:
            return False
        if work is not None and work == self._work_at_last:
            return False
        self._last, self._work_at_last = now, work
        self._trim(0)
        give_back_free_pages()  # free KV blocks' pages: the pool's slabs are live allocations
        self.num_trims += 1
        return True

    def start(self, idle: Callable[[], bool], work: Callable[[], int], poll_s: float = 0.25) -> None:
        """Check every `poll_s` seconds on a daemon thread of its own (no-op when disabled)."""
        if not self.enabled:
            return
        self._work_at_last = work()  # what ran before (loading, warming up) the replica trimmed already

        def loop() -> None:
            while not self._stop.wait(poll_s):
                try:
                    self.maybe_trim(idle(), work())
                except Exception:  # NOTE: giving memory back must never take the replica down
                    log.exception("malloc_trim failed")

        threading.Thread(target=loop, name="headstart-heap-trim", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
