"""How far a data session's cache is behind its acknowledged pushes, and the bound past which
a push is refused (`IngestionBehind`) instead of growing the backlog.

A push is acknowledged once its rows are buffered on the replica; it is
*behind* until every one of its rows is handled (in the cache, refused by the
database, or dropped from a full buffer). A session's lag is then:

- `versions`: acknowledged pushes not yet handled (each would have been a data
  version of its own, had ingestion kept up);
- `rows`: their rows;
- `seconds`: the age of the oldest of them (0 when caught up): how stale the
  newest answer is against what the producer was told is in.

`IngestionLag` is one session's record; `LagHistogram` the replica's
distribution of ingestion delays (acknowledgement to handled, per push), the
series `/metrics` exports with the max / sum over sessions.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from headstart.engine.errors import HeadstartError

# Seconds: a push handled within a forward or two, up to a session minutes behind.
LAG_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
MIN_RETRY_S, MAX_RETRY_S = 0.1, 30.0


class IngestionBehind(HeadstartError):
    """A push refused because its session's ingestion is past its lag bound: nothing of it was
    kept; retry after `retry_after_s` (HTTP 503 + Retry-After, gRPC UNAVAILABLE + pushback)."""

    code = "INGESTION_BEHIND"

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Lag:
    """One session's lag now (module doc)."""

    versions: int = 0
    rows: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"lag_versions": self.versions, "lag_rows": self.rows, "lag_seconds": round(self.seconds, 4)}


@dataclass(frozen=True)
class LagBound:
    """Past either bound a push is refused (`IngestionBehind`); 0 turns a bound off.

    max_versions: acknowledged pushes behind; max_seconds: age of the oldest one."""

    max_versions: int = 0
    max_seconds: float = 0.0

    def exceeded(self, lag: Lag) -> str | None:
        """Why `lag` is past the bound, or None."""
        if self.max_versions and lag.versions >= self.max_versions:
            return f"{lag.versions} pushes behind (the bound is {self.max_versions})"
        if self.max_seconds and lag.seconds >= self.max_seconds:
            return f"{lag.seconds:.1f} s behind (the bound is {self.max_seconds:g} s)"
        return None


class IngestionLag:
    """One session's acknowledged pushes not yet handled, oldest first (the caller holds the
    session's lock around every call).

    Args:
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._pushes: deque[tuple[int, int, float]] = deque()  # (last seq, rows, acknowledged at)
        self._rows = 0
        self._rate = 0.0  # rows handled per second, smoothed (the retry hint)
        self._last_handled: float | None = None

    def pushed(self, last_seq: int, rows: int) -> None:
        """A push was acknowledged: its newest row's seq and its row count."""
        self._pushes.append((last_seq, rows, self._clock()))
        self._rows += rows

    def handled(self, through_seq: int) -> list[float]:
        """Every row up to `through_seq` is handled: the delays (s) of the pushes now complete."""
        now, delays, rows = self._clock(), [], 0
        while self._pushes and self._pushes[0][0] <= through_seq:
            _, count, at = self._pushes.popleft()
            delays.append(now - at)
            rows += count
        self._rows -= rows
        if rows:
            if self._last_handled is not None and now > self._last_handled:
                rate = rows / (now - self._last_handled)
                self._rate = rate if not self._rate else 0.8 * self._rate + 0.2 * rate
            self._last_handled = now
        return delays

    def clear(self) -> None:
        """The session closed or failed: nothing is behind any more."""
        self._pushes.clear()
        self._rows = 0

    def current(self) -> Lag:
        if not self._pushes:
            return Lag()
        return Lag(len(self._pushes), self._rows, max(0.0, self._clock() - self._pushes[0][2]))

    def retry_after(self, bound: LagBound) -> float:
        """Seconds until the backlog is likely back under `bound`: the rows beyond half of it at the
        rate rows were handled lately (1 s before any were), clamped to [0.1, 30]."""
        lag = self.current()
        if self._rate <= 0:
            guess = 1.0
        else:
            guess = self._rows / 2 / self._rate
        if bound.max_seconds:
            guess = min(guess, max(lag.seconds - bound.max_seconds / 2, MIN_RETRY_S))
        return min(MAX_RETRY_S, max(MIN_RETRY_S, guess))


class LagHistogram:
    """Cumulative counts of ingestion delays over `LAG_BUCKETS_S` (thread-safe): Prometheus's
    histogram shape, kept without a metrics library so any process can report it."""

    def __init__(self, buckets: Iterable[float] = LAG_BUCKETS_S):
        self.buckets = tuple(buckets)
        self._counts = [0] * len(self.buckets)
        self._sum, self._count = 0.0, 0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            for i, upper in enumerate(self.buckets):
                if seconds <= upper:
                    self._counts[i] += 1
            self._sum += seconds
            self._count += 1

    def snapshot(self) -> tuple[list[int], float, int]:
        """(cumulative count per bucket, sum, count): +Inf's count is `count`."""
        with self._lock:
            return list(self._counts), self._sum, self._count


@dataclass(frozen=True)
class LagSummary:
    """A replica's sessions' lag: the worst and the total (bounded label cardinality on /metrics)."""

    max_versions: int = 0
    sum_versions: int = 0
    max_seconds: float = 0.0
    sessions_behind: int = 0

    @classmethod
    def of(cls, lags: Iterable[Lag]) -> LagSummary:
        lags = list(lags)
        behind = [lag for lag in lags if lag.versions]
        return cls(max((lag.versions for lag in lags), default=0), sum(lag.versions for lag in lags),
                   max((lag.seconds for lag in lags), default=0.0), len(behind))
