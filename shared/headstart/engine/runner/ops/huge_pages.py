"""Weights in transparent huge pages, for the kernels that stream them.

A decode step reads every weight once from memory; with 4 KiB pages that is
half a million pages (0.5B model, float32) and as many TLB misses. In one
anonymous mapping advised `MADV_HUGEPAGE` the same bytes sit in 2 MiB pages,
and the native kernel streams them about a tenth faster
(docs/benchmarks-archive.md).

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


def huge_page_copies(groups: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """One contiguous matrix per group (its tensors stacked along dim 0, as
    `torch.cat` would; CPU, one dtype per group), each written straight into
    one anonymous mapping advised for huge pages, its start aligned to 2 MiB.
    The mapping lives as long as any of the results (each holds a reference)."""
    shapes, offsets, size = [], [], 0
    for parts in groups:
        size = -(-size // ALIGN) * ALIGN
        offsets.append(size)
        shapes.append((sum(p.shape[0] for p in parts), *parts[0].shape[1:]))
        size += sum(p.numel() for p in parts) * parts[0].element_size()
    if size == 0:
        return [torch.cat(parts) for parts in groups]
    region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError) as exc:  # no THP here: plain pages, same results
        log.info("huge pages not available for the weights (%s)", exc)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = (-raw.data_ptr()) % HUGE_PAGE
    out = []
    for parts, shape, offset in zip(groups, shapes, offsets):
        dtype = parts[0].dtype
        nbytes = sum(p.numel() for p in parts) * parts[0].element_size()
        matrix = raw[start + offset:start + offset + nbytes].view(dtype).view(shape)
        torch.cat(parts, dim=0, out=matrix)
        out.append(matrix)
    return out
