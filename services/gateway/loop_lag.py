"""An event-loop lag probe: how late the gateway's loop wakes a sleeper.

Every message of every tenant is handled on the gateway's one event loop, so
anything that holds that loop (or the GIL its thread needs) delays everyone.
The probe sleeps `period_s` over and over and records how much later than
asked it woke up; the lag's percentiles say whether B's extra latency beside
a noisy A is spent waiting for the loop (issue 16).
"""

from __future__ import annotations

import asyncio
import collections
import time


class LoopLagProbe:
    """Start with `start()` on the loop to probe; `stats()` from any thread."""

    def __init__(self, period_s: float = 0.005, keep: int = 20000):
        self.period_s = period_s
        self._lags: collections.deque[float] = collections.deque(maxlen=keep)
        self._task: asyncio.Task | None = None

    def start(self) -> "LoopLagProbe":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def reset(self) -> None:
        self._lags.clear()

    async def _run(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self._lags.append(max(0.0, time.perf_counter() - asked - self.period_s))

    def stats(self) -> dict[str, float]:
        """Lag in ms since the last reset: samples, p50, p99, max (0 with no samples)."""
        lags = sorted(self._lags)
        if not lags:
            return {"samples": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}

        def q(p: float) -> float:
            return lags[min(len(lags) - 1, int(p / 100.0 * len(lags)))] * 1000.0

        return {"samples": len(lags), "p50_ms": q(50), "p99_ms": q(99), "max_ms": lags[-1] * 1000.0}
