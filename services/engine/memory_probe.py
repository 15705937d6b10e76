"""What a replica process holds, counted: live objects of the engine's types,
bytes of live tensors, Python heap, threads and RSS.

Used by the directed leak experiment (`bench/replica_memory.py`) and its
test: a workload cycle that opens, closes, abandons and leaves sessions past
the session cap must bring every count back to the same plateau. RSS alone
cannot tell a leak from the allocator keeping freed pages, so the counts
are what is asserted; RSS is reported beside them.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Types whose live count must not grow with the number of sessions served.
WATCHED = (
    "Session", "KVState", "DynamicCache", "GenerationRequest", "Job", "SessionStream",
    "Task", "Future", "Queue", "PromptBuilder", "Thread", "TextDeltas",
)


@dataclass(frozen=True)
class MemorySnapshot:
    """One reading (all counts after a full `gc.collect()`)."""

    counts: dict[str, int] = field(default_factory=dict)  # live objects per watched type name
    tensor_bytes: int = 0  # bytes of distinct tensor storages reachable as Python objects
    num_tensors: int = 0
    gc_objects: int = 0  # every object the collector tracks (not those frozen before: `frozen`)
    frozen: int = 0  # objects gc.freeze() moved out of sight (Ray workers freeze their imports)
    traced_bytes: int = 0  # Python heap (tracemalloc; 0 when not tracing)
    num_threads: int = 0
    rss_mib: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def rss_mib() -> float:
    """This process's resident memory in MiB (0.0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def snapshot(watched: tuple[str, ...] = WATCHED) -> MemorySnapshot:
    """Count what this process holds now (seconds on a big heap: diagnostics only)."""
    import torch

    gc.collect()
    with warnings.catch_warnings():  # isinstance on some torch module objects warns (deprecated aliases)
        warnings.simplefilter("ignore")
        return _count(gc.get_objects(), set(watched), torch.Tensor)


def _count(objects: list, names: set[str], tensor_type: type) -> MemorySnapshot:
    counts: Counter[str] = Counter()
    storages: dict[int, int] = {}
    num_tensors = 0
    for obj in objects:
        name = type(obj).__name__
        if name in names:
            counts[name] += 1
        if isinstance(obj, tensor_type) and obj.device.type != "meta":
            num_tensors += 1
            try:
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):  # sparse or other storage-less tensors
                pass
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    return MemorySnapshot(dict(sorted(counts.items())), sum(storages.values()), num_tensors, len(objects),
                          gc.get_freeze_count(), traced, threading.active_count(), rss_mib())
