"""Load/compute pipeline: fetch the blocks of micro-batch i+1 while micro-batch i computes.

The paper's computation loading pipeline (section 4.2.2). One background
thread runs `load`; the calling thread runs `compute`:

    caller:  load(b0) wait | compute(b0) | compute(b1) | compute(b2) ...
    loader:                | load(b1)    | load(b2)    | load(b3)   ...

`load(batch)` fetches a batch's blocks from the stores and admits them to the
device tier (pinned); on CUDA the copies are non-blocking on a side stream
(`transfer.BlockTransfer`), and `compute` calls `transfer.wait()` before it
reads the blocks, so the copy overlaps the previous forward pass. On CPU the
loader thread alone provides the overlap.

Exceptions propagate to the caller: a failed `load` surfaces when its batch
is due (after the previous batch's result was produced), a failed `compute`
at once; either way the loader thread is stopped and joined before raising.
Stores used by `load` should already turn their own failures into misses
(`store.fallback`), so a Redis outage slows a batch instead of failing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

B = TypeVar("B")
L = TypeVar("L")
R = TypeVar("R")


def iter_pipeline(
    batches: Iterable[B],
    load: Callable[[B], L],
    compute: Callable[[B, L], R],
    *,
    thread_name: str = "table-prefetch",
) -> Iterator[R]:
    """Yield `compute(batch, load(batch))` for each batch, loading one batch ahead.

    Closing the iterator early stops prefetching (the in-flight load finishes,
    nothing new starts).
    """
    it = iter(batches)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
    pending: Future[L] | None = None
    try:
        batch = next(it, _END)
        if batch is _END:
            return
        pending = executor.submit(load, batch)
        while batch is not _END:
            loaded = pending.result()  # re-raises the loader's exception
            following = next(it, _END)
            pending = executor.submit(load, following) if following is not _END else None
            yield compute(batch, loaded)
            batch = following
    finally:
        if pending is not None:
            pending.cancel()
        executor.shutdown(wait=True, cancel_futures=True)


def run_pipeline(
    batches: Iterable[B],
    load: Callable[[B], L],
    compute: Callable[[B, L], R],
) -> list[R]:
    """All results of `iter_pipeline`, in batch order."""
    return list(iter_pipeline(batches, load, compute))


class _End:
    """Marks the end of the batches (a batch may legitimately be None)."""


_END = _End()
