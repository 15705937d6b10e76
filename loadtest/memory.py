"""Memory of the local stack's processes, sampled while a load test runs.

The gateway runs inside the `headstart loadtest` process (with the Ray
driver); the engine replicas are Ray actor processes (`ray::ServeReplica...`)
descended from it. Resident memory (VmRSS) is read from /proc (Linux).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPLICA_TITLE = b"ray::ServeReplica"


def rss_mib(pid: int) -> float | None:
    """Resident memory of `pid` in MiB (None: gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def replica_pids(root: int | None = None) -> list[int]:
    """Engine replica processes among the descendants of `root` (default: this process)."""
    children, found, todo = _children_map(), [], [root or os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(REPLICA_TITLE):
                    found.append(pid)
            except OSError:
                pass
    return sorted(found)


@dataclass
class MemorySampler:
    """Samples the gateway's and each replica's RSS every `period_s` on a thread."""

    period_s: float = 5.0
    samples: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadtest-memory", daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> "MemorySampler":
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(10)
        return self.samples

    def sample(self) -> dict:
        replicas = {str(pid): rss_mib(pid) for pid in replica_pids()}
        row = {"t_s": round(time.monotonic() - self._t0, 1), "gateway_mib": rss_mib(os.getpid()),
               "replicas_mib": {pid: mib for pid, mib in replicas.items() if mib is not None}}
        self.samples.append(row)
        return row

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.period_s):
                return


def memory_trend(samples: list[dict], tolerance: float = 0.05, floor_mib: float = 25.0) -> dict:
    """Is each process's memory flat? Compares the mean of the second quarter of
    the run (after warm-up: model loaded, caches filled) with the last quarter.

    Flat: the change is within `tolerance` of the earlier level or `floor_mib`,
    whichever is larger. Replicas are summed (a restarted replica changes pids).
    """
    if len(samples) < 8:
        return {"num_samples": len(samples), "verdict": "too few samples"}
    n = len(samples)
    series = {
        "gateway": [s["gateway_mib"] or 0.0 for s in samples],
        "replicas": [sum(s["replicas_mib"].values()) for s in samples],
    }
    out: dict = {"num_samples": n, "duration_s": samples[-1]["t_s"]}
    for name, values in series.items():
        early = values[n // 4: n // 2]
        late = values[3 * n // 4:]
        early_mean, late_mean = sum(early) / len(early), sum(late) / len(late)
        change = late_mean - early_mean
        allowed = max(tolerance * early_mean, floor_mib)
        out[name] = {"start_mib": values[0], "warm_mib": round(early_mean, 1), "end_mib": round(late_mean, 1),
                     "max_mib": max(values), "change_mib": round(change, 1), "flat": abs(change) <= allowed}
    return out
