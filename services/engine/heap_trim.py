"""Giving a replica's freed heap pages back to the system when it is idle (issue 14).

A replica's KV caches grow by `torch.cat` (a new, larger tensor each step),
and sessions come and go: blocks of many sizes are freed all the time, and
glibc keeps them (`headstart.heap`), so the resident size creeps up with the
work done while the bytes in use stay flat (docs/benchmarks-archive.md,
"Soak: memory over 30 minutes"). `malloc_trim(0)` takes the arenas' locks,
so the replica calls it only between requests, at most every
`HEADSTART_MALLOC_TRIM_S` seconds (from its health check).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from headstart.heap import libc_malloc_trim

log = logging.getLogger(__name__)

__all__ = ["HeapTrimmer", "libc_malloc_trim"]


class HeapTrimmer:
    """Calls `malloc_trim(0)` when the replica is idle and `period_s` has passed
    since the last call (period 0, or no glibc: never)."""

    def __init__(self, period_s: float, trim: Callable[[int], int] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if period_s < 0:
            raise ValueError("period_s must be >= 0")
        self.period_s = period_s
        self._trim = trim if trim is not None else (libc_malloc_trim() if period_s else None)
        self._clock = clock
        self._last = clock()
        self.num_trims = 0

    @property
    def enabled(self) -> bool:
        return self.period_s > 0 and self._trim is not None

    def maybe_trim(self, idle: bool) -> bool:
        """Trim now if enabled, `idle` (no forward work queued or running) and due.

        Called from the replica's health check (every few seconds); returns
        whether it trimmed. NOTE: a busy replica is not trimmed: the pages it
        frees now it will likely take again at the next step."""
        now = self._clock()
        if not self.enabled or not idle or now - self._last < self.period_s:
            return False
        self._last = now
        self._trim(0)
        self.num_trims += 1
        return True
