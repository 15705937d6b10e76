"""A per-iteration trace of the forward worker, one JSON line per plan.

Set `HEADSTART_TRACE_FORWARDS=/path/trace.jsonl` to see what the worker ran
and how long it took: which jobs shared a forward, each row's new tokens and
cache length, the queue behind it. It answers "where did the time to the last
token go" under load, which aggregate metrics cannot. Off by default: a line
per forward costs a little I/O.

Each line: `{"t": s since the trace opened, "ms": the iteration's wall time,
"forward_ms": of which the model's forwards (the rest: the jobs' steps and commits),
"waiting": jobs queued after the plan was taken, "deferred": decode steps
that ranked behind typing, "rows": [[job name, rank class, planned tokens,
new tokens run, cache length before], ...], "forwards": rows per forward}`.
A row that needed no forward has new tokens 0. The rank class is its name
(`Priority`: "STREAM", "DEFERRED_DECODE", ...).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path


class ForwardTrace:
    """Appends one JSON line per worker iteration to `path` (line-buffered)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1)
        self._lock = threading.Lock()
        self.opened = time.perf_counter()  # a line's `t` is seconds since this (`time.perf_counter`'s clock)

    def record(self, started: float, ended: float, forward_s: float, waiting: int, deferred: int,
               rows: list[tuple[str, str, int, int, int]], forwards: list[int]) -> None:
        line = {"t": round(started - self.opened, 4), "ms": round((ended - started) * 1000, 2),
                "forward_ms": round(forward_s * 1000, 2),
                "waiting": waiting, "deferred": deferred, "rows": rows, "forwards": forwards}
        with self._lock:
            if not self._file.closed:
                self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()
