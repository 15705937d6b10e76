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
at once; either way the loader thread is joined before raising, and every
batch loaded but not computed goes to `discard` (to unpin its blocks).
Stores used by `load` should already turn their own failures into misses
(`store.fallback`), so a Redis outage slows a batch instead of failing it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

log = logging.getLogger(__name__)

B = TypeVar("B")
L = TypeVar("L")
R = TypeVar("R")


def iter_pipeline(
    batches: Iterable[B],
    load: Callable[[B], L],
    compute: Callable[[B, L], R],
    *,
    discard: Callable[[B, L], None] | None = None,
    thread_name: str = "table-prefetch",
) -> Iterator[R]:
    """Yield `compute(batch, load(batch))` for each batch, loading one batch ahead.

    Args:
        discard: called with a batch that was loaded but will never be
            computed (an error, or the caller stopped iterating), so its
            blocks can be unpinned. A `load` that raises gets no `discard`:
            it must release what it pinned before raising.

    When iteration stops early (an exception, or the iterator is closed) the
    load in flight is waited for, handed to `discard`, and nothing new starts.
    """
    it = iter(batches)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
    ahead: tuple[B, Future[L]] | None = None
    try:
        batch = next(it, _END)
        if batch is _END:
            return
        ahead = (batch, executor.submit(load, batch))
        while ahead is not None:
            batch, future = ahead
            ahead = None
            loaded = future.result()  # re-raises the loader's exception
            try:
                following = next(it, _END)
                if following is not _END:
                    ahead = (following, executor.submit(load, following))
                result = compute(batch, loaded)
            except BaseException:
                _discard(discard, batch, loaded)
                raise
            yield result
    finally:
        if ahead is not None:
            _finish_unused(ahead, discard)
        executor.shutdown(wait=True)


def _finish_unused(ahead: tuple[B, Future[L]], discard: Callable[[B, L], None] | None) -> None:
    """Wait for a prefetch nobody will compute and discard what it loaded."""
    batch, future = ahead
    try:
        loaded = future.result()
    except Exception as exc:  # noqa: BLE001 - already stopping; this load's failure changes nothing
        log.info("prefetch of an unused batch failed: %r", exc)
        return
    _discard(discard, batch, loaded)


def _discard(discard: Callable[[B, L], None] | None, batch: B, loaded: L) -> None:
    if discard is None:
        return
    try:
        discard(batch, loaded)
    except Exception:  # noqa: BLE001 - do not mask the reason the pipeline stopped
        log.exception("discarding a loaded batch failed")


def run_pipeline(
    batches: Iterable[B],
    load: Callable[[B], L],
    compute: Callable[[B, L], R],
    *,
    discard: Callable[[B, L], None] | None = None,
) -> list[R]:
    """All results of `iter_pipeline`, in batch order."""
    return list(iter_pipeline(batches, load, compute, discard=discard))


class _End:
    """Marks the end of the batches (a batch may legitimately be None)."""


_END = _End()
