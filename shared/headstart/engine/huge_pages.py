"""Weights in transparent huge pages, for the kernels that stream them.

A decode step reads every weight once from memory; with 4 KiB pages that is
half a million pages (0.5B model, float32) and as many TLB misses. In one
anonymous mapping advised `MADV_HUGEPAGE` the same bytes sit in 2 MiB pages.
Measured on the 2-core EPYC (Linux 6.18, THP "madvise"): the 0.5B model's
matrices streamed by the native kernel in 57-59 ms from huge pages against
63-65 ms from torch's allocator (3 alternating rounds, docs/benchmarks.md).

Linux with THP in "always" or "madvise" mode; elsewhere (or if the advice
is refused) the copies are plain memory and everything still works.
"""

from __future__ import annotations

import logging
import mmap

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line


def huge_page_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous copies of `tensors` (CPU, any dtypes) carved from one
    anonymous mapping advised for huge pages, its start aligned to 2 MiB.
    The mapping lives as long as any of the copies (each holds a reference)."""
    offsets, size = [], 0
    for t in tensors:
        size = -(-size // ALIGN) * ALIGN
        offsets.append(size)
        size += t.numel() * t.element_size()
    if size == 0:
        return [t.clone() for t in tensors]
    region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError) as exc:  # no THP here: plain pages, same results
        log.info("huge pages not available for the weights (%s)", exc)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = (-raw.data_ptr()) % HUGE_PAGE
    copies = []
    for t, offset in zip(tensors, offsets):
        nbytes = t.numel() * t.element_size()
        piece = raw[start + offset:start + offset + nbytes].view(t.dtype).view(t.shape)
        piece.copy_(t)
        copies.append(piece)
    return copies
