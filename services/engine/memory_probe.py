"""What a replica process holds, counted: live objects of the engine's types,
bytes of live tensors, Python heap, threads and RSS.

Used by the directed leak experiment (`bench/replica_memory.py`) and its
test: a workload cycle that opens, closes, abandons and leaves sessions past
the session cap must bring every count back to the same plateau. RSS alone
cannot tell a leak from the allocator keeping freed pages, so the counts
are what is asserted; RSS is reported beside them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import itertools
import sys
import threading
import time
import tracemalloc
from collections import Counter
from operator import attrgetter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Types whose live count must not grow with the number of sessions served.
WATCHED = (
    "Session", "KVState", "PagedCache", "BlockTable", "GenerationRequest", "Job", "SessionStream",
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


_type_name = attrgetter("__name__")

# Far longer than a walk of a replica's heap (C-level passes, under a second for millions of objects): no
# other thread takes the GIL meanwhile. A thread busy in Python delays the walk's start by at most this.
_WALK_SWITCH_INTERVAL_S = 5.0


@contextmanager
def _heap_walk() -> Iterator[None]:
    """Keep every other thread of this process still while `gc.get_objects()`'s list lives.

    NOTE: that list holds a reference to every tracked object, among them a
    tuple another thread is building from an iterator (`tuple(generator)`,
    whose Python code may hand the GIL over between items). CPython 3.11
    resizes such a tuple in place only while it holds the sole reference:
    with the list's it raises "SystemError: Objects/tupleobject.c: bad
    argument to internal function" in that thread (a replica's schema load
    failed so while a load test probed it). A thread waiting for the GIL asks
    its holder to hand it over after the switch interval; with the interval
    beyond the walk, and the GIL handed over once (`time.sleep(0)`) so that
    every waiter starts its wait anew under it, none asks during the walk.
    The collector is off meanwhile: its finalizers run Python code. Inside,
    the list must be dropped quickly (C-level passes only, no I/O): were the
    walk longer than the interval, a waiter would ask after all."""
    interval = sys.getswitchinterval()
    enabled = gc.isenabled()
    gc.disable()
    sys.setswitchinterval(_WALK_SWITCH_INTERVAL_S)
    try:
        time.sleep(0)  # release and retake the GIL: waits begun under the old interval start over
        yield
    finally:
        sys.setswitchinterval(interval)
        if enabled:
            gc.enable()


def _heap_types_and_tensors(tensor_type: type | None = None) -> tuple[list[type], list, int]:
    """(the type of every object the collector tracks, the `tensor_type` objects among
    them (none when None), how many).

    The list `gc.get_objects()` returns lives only for a few C-level passes
    (`map`, `compress`: no Python code runs between objects) inside
    `_heap_walk`, so it is gone long before another thread could ask for the
    GIL; the counting afterwards holds types and tensors only."""
    with _heap_walk():
        objects = gc.get_objects()
        types = list(map(type, objects))
        tensors = [] if tensor_type is None else \
            list(itertools.compress(objects, map(issubclass, types, itertools.repeat(tensor_type))))
        num_objects = len(objects)
        del objects
    return types, tensors, num_objects


def snapshot(watched: tuple[str, ...] = WATCHED) -> MemorySnapshot:
    """Count what this process holds now (seconds on a big heap: diagnostics only)."""
    import torch

    gc.collect()
    types, tensors, num_objects = _heap_types_and_tensors(torch.Tensor)
    counts, tensor_bytes, num_tensors = _count(types, tensors, set(watched))
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    return MemorySnapshot(counts, tensor_bytes, num_tensors, num_objects, gc.get_freeze_count(), traced,
                          threading.active_count(), rss_mib())


def _count(types: list[type], tensors: list, names: set[str]) -> tuple[dict[str, int], int, int]:
    """(live objects per watched type name, bytes of distinct tensor storages, tensors)."""
    counts = Counter(filter(names.__contains__, map(_type_name, types)))
    storages: dict[int, int] = {}
    num_tensors = 0
    for tensor in tensors:
        if tensor.device.type == "meta":
            continue
        num_tensors += 1
        try:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse or other storage-less tensors
            pass
    return dict(sorted(counts.items())), sum(storages.values()), num_tensors


def malloc_trim() -> float | None:
    """Give freed pages back as the replica's idle trim does: glibc's free
    heap (`malloc_trim(0)`) and the KV pool's free blocks
    (`block_pool.give_back_free_pages`); this process's RSS in MiB after it
    (None where there is no glibc).

    RSS that falls back under trim was free memory the allocator kept
    (fragmentation, arenas); RSS that stays is memory something holds."""
    from headstart.engine.kv.block_pool import give_back_free_pages
    from headstart.heap import libc_malloc_trim

    trim = libc_malloc_trim()
    if trim is None:
        return None
    trim(0)
    give_back_free_pages()
    return rss_mib()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_stats() -> dict[str, float] | None:
    """glibc's own account of its heap (`mallinfo2`), in MiB, without changing it:
    `in_use` (allocated and not freed: heap chunks plus mmapped blocks) and
    `free_held` (freed, kept by the allocator in its arenas). RSS growing with
    `in_use` flat is the allocator (fragmentation), not a leak. None without glibc >= 2.33."""
    name = ctypes.util.find_library("c")
    try:
        func = getattr(ctypes.CDLL(name), "mallinfo2") if name else None
    except (OSError, AttributeError):
        return None
    if func is None:
        return None
    func.restype = _MallInfo2
    info = func()
    mib = 2.0 ** 20
    return {"in_use_mib": round((info.uordblks + info.hblkhd) / mib, 1), "free_held_mib": round(info.fordblks / mib, 1),
            "arena_mib": round(info.arena / mib, 1), "mmapped_mib": round(info.hblkhd / mib, 1)}


def type_counts() -> dict[str, int]:
    """Live objects the collector tracks, by type name (after a full collection).

    Diffing two of these between workload cycles names what grows; objects
    the collector does not track (str, bytes, int) show in `allocated_blocks`."""
    gc.collect()
    types, _, _ = _heap_types_and_tensors()
    return dict(Counter(map(_type_name, types)))


def allocated_blocks() -> int:
    """Memory blocks CPython's allocator has handed out and not got back
    (every Python object, tracked by the collector or not)."""
    return sys.getallocatedblocks()


def thread_names() -> dict[str, int]:
    """Live threads by name, digits dropped (`ThreadPoolExecutor-0_3` -> `ThreadPoolExecutor-_`)."""
    return dict(Counter("".join(c for c in t.name if not c.isdigit()) for t in threading.enumerate()))


def top_growth(before: dict[str, int], after: dict[str, int], top: int = 15) -> list[tuple[str, int]]:
    """The `top` names whose counts grew most from `before` to `after`."""
    grown = ((name, after.get(name, 0) - before.get(name, 0)) for name in set(before) | set(after))
    return sorted((g for g in grown if g[1] > 0), key=lambda g: -g[1])[:top]


def prometheus_samples() -> int:
    """Samples in this process's default Prometheus registry: one per label set,
    so a label that carries a session or request id shows as growth here."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return 0
    return sum(len(metric.samples) for metric in REGISTRY.collect())


def traced_growth(before, top: int = 15, frames: int = 8):
    """(snapshot now, [(source line, bytes grown, blocks grown)]) since `before`,
    a snapshot this returned earlier; the first call (None) starts tracemalloc."""
    if before is None or not tracemalloc.is_tracing():
        tracemalloc.start(frames)
        return tracemalloc.take_snapshot(), []
    gc.collect()
    now = tracemalloc.take_snapshot()
    stats = now.compare_to(before, "traceback")
    # a Traceback runs oldest frame first: the allocating line is the last one
    grown = [(" <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in reversed(list(s.traceback)[-4:])),
              s.size_diff, s.count_diff) for s in stats[:top] if s.size_diff > 0]
    return now, grown
