"""Memory of the local stack's processes, sampled while a load test runs.

The gateway runs inside the `headstart loadtest` process (with the Ray
driver); the engine replicas are Ray actor processes (`ray::ServeReplica...`)
descended from it. Resident memory (VmRSS) is read from /proc (Linux).

RSS alone cannot tell a leak from the allocator keeping freed pages, so the
sampler can also call the replica's own `memory_probe` now and then: glibc's
bytes in use (`mallinfo2`, what is allocated and not freed) and the live
object counts. RSS growing with the heap in use flat is fragmentation.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPLICA_TITLE = b"ray::ServeReplica"


def _status_mib(pid: int, field: str) -> float | None:
    """A `kB` field of /proc/PID/status in MiB (None: gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


def rss_mib(pid: int) -> float | None:
    """Resident memory of `pid` in MiB (None: gone or unreadable)."""
    return _status_mib(pid, "VmRSS")


def peak_rss_mib(pid: int) -> float | None:
    """The highest resident memory of `pid` in MiB since it started or since `reset_peak_rss` (VmHWM)."""
    return _status_mib(pid, "VmHWM")


def reset_peak_rss(pid: int) -> bool:
    """Restart `pid`'s VmHWM from its current RSS (Linux >= 4.0: `5` to clear_refs; our own processes only)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


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


def descendants(root: int | None = None) -> list[int]:
    """Every process descended from `root` (default: this process)."""
    children, found, todo = _children_map(), [], [root or os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            found.append(pid)
    return found


def replica_pids(root: int | None = None) -> list[int]:
    """Engine replica processes among the descendants of `root` (default: this process)."""
    found = []
    for pid in descendants(root):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(REPLICA_TITLE):
                found.append(pid)
        except OSError:
            pass
    return sorted(found)


def probe_summary(probe: dict, before: dict | None = None) -> dict:
    """The few numbers of a replica `memory_probe` answer a soak keeps (MiB,
    counts), with the types whose live objects grew most since `before`
    (an earlier answer of the same replica; both with `detail`)."""
    from services.engine.memory_probe import top_growth

    malloc = probe.get("malloc") or {}
    out = {"pid": probe.get("pid"), "rss_mib": round(probe.get("rss_mib", 0.0), 1),
           "heap_in_use_mib": malloc.get("in_use_mib"), "heap_free_held_mib": malloc.get("free_held_mib"),
           "gc_objects": probe.get("gc_objects"), "tensor_mib": round(probe.get("tensor_bytes", 0) / 2**20, 1),
           "sessions": probe.get("num_sessions"), "threads": probe.get("num_threads"),
           "heap_trims": probe.get("heap_trims")}
    if "tables" in probe:
        out |= {"tables": probe["tables"], "prometheus_samples": probe.get("prometheus_samples")}
    if before and before.get("pid") == probe.get("pid") and "type_counts" in before and "type_counts" in probe:
        out["grew"] = top_growth(before["type_counts"], probe["type_counts"], 8)
    return out


@dataclass
class MemorySampler:
    """Samples the gateway's and each replica's RSS every `period_s` on a thread,
    and every `probe_period_s` a replica's own account (`probe`: a call of its
    `memory_probe`, None: not probed) under the row's `replica_probe`."""

    period_s: float = 5.0
    samples: list[dict] = field(default_factory=list)
    probe: Callable[[], dict] | None = None
    probe_period_s: float = 60.0

    def __post_init__(self) -> None:
        self._next_probe = 0.0
        self._last_probe: dict | None = None
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
        if self.probe is not None and row["t_s"] >= self._next_probe:
            self._next_probe = row["t_s"] + self.probe_period_s
            try:
                answer = self.probe()
                row["replica_probe"] = probe_summary(answer, self._last_probe)
                self._last_probe = answer
            except Exception as exc:  # NOTE: a replica busy or restarting must not end the sampling
                row["replica_probe"] = {"error": repr(exc)[:200]}
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
    Where the replica was probed (8 probes or more of one process: with several
    replicas the most probed), `replica_heap` is the same verdict on glibc's
    bytes in use inside it: a leak grows it, fragmentation grows only RSS.
    """
    if len(samples) < 8:
        return {"num_samples": len(samples), "verdict": "too few samples"}
    series = {
        "gateway": [s["gateway_mib"] or 0.0 for s in samples],
        "replicas": [sum(s["replicas_mib"].values()) for s in samples],
    }
    probes = [s["replica_probe"] for s in samples if (s.get("replica_probe") or {}).get("heap_in_use_mib") is not None]
    # NOTE: with several replicas the handle reaches one or another: one process's series only
    pid = Counter(p.get("pid") for p in probes).most_common(1)[0][0] if probes else None
    probes = [p for p in probes if p.get("pid") == pid]
    if len(probes) >= 8:
        series["replica_heap"] = [p["heap_in_use_mib"] for p in probes]
    out: dict = {"num_samples": len(samples), "duration_s": samples[-1]["t_s"]}
    for name, values in series.items():
        out[name] = _trend(values, tolerance, floor_mib)
    return out


def _trend(values: list[float], tolerance: float, floor_mib: float) -> dict:
    n = len(values)
    early, late = values[n // 4: n // 2], values[3 * n // 4:]
    early_mean, late_mean = sum(early) / len(early), sum(late) / len(late)
    change = late_mean - early_mean
    allowed = max(tolerance * early_mean, floor_mib)
    return {"start_mib": values[0], "warm_mib": round(early_mean, 1), "end_mib": round(late_mean, 1),
            "max_mib": max(values), "change_mib": round(change, 1), "flat": abs(change) <= allowed,
            # a fall (the start-up peak given back) is not a leak: told apart from a rise
            "growing": change > allowed}
