"""The block pool's memory goes back to the system as blocks are freed (issue 45): a freed block's
pages in a slab that stays are no longer resident right after the release (not at the next idle
trim), and a slab whose blocks are all free is unmapped. Residency is read from the kernel
(`mincore`), not inferred from RSS."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

import pytest
import torch

from headstart.engine.kv.block_pool import BlockPool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise/mincore: Linux")

HEADS, DIM, TOKENS = 2, 64, 64  # a block: 64 tokens x 64 dims x 4 bytes = 4 pages per head


def _resident_pages(address: int, length: int) -> int:
    """Pages of [address, address + length) resident now (whole pages inside the range)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    page = mmap.PAGESIZE
    start, end = -(-address // page) * page, (address + length) // page * page
    if end <= start:
        return 0
    vec = (ctypes.c_ubyte * ((end - start) // page))()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(b & 1 for b in vec)


def _block_range(pool: BlockPool, block: int) -> tuple[int, int]:
    keys, _ = pool.view(0, block, 0, TOKENS)  # [1, heads, tokens, dim]: head 0's tokens are contiguous
    return keys.data_ptr(), TOKENS * DIM * keys.element_size()


def _fill(pool: BlockPool, block: int) -> None:
    data = torch.ones((1, HEADS, TOKENS, DIM))
    pool.write(0, block, 0, data, data)


def test_a_freed_block_gives_its_pages_back_at_once_and_an_empty_slab_is_unmapped():
    pool = BlockPool(HEADS, DIM, torch.float32, "cpu", block_tokens=TOKENS, slab_blocks=4)
    kept, freed = pool.allocate(2)
    for block in (kept, freed):
        _fill(pool, block)
    address, length = _block_range(pool, freed)
    assert _resident_pages(address, length) >= length // mmap.PAGESIZE - 1  # written: resident
    pool.release([freed])
    assert _resident_pages(address, length) == 0  # the slab stays (`kept`), the freed block's pages do not
    assert _resident_pages(*_block_range(pool, kept)) > 0
    again = pool.allocate(1)  # the lowest free id: the same block, its pages faulted in as it is written
    assert again == [freed]
    _fill(pool, freed)
    assert _resident_pages(address, length) == length // mmap.PAGESIZE
    pool.release(again + [kept])
    assert pool.stats().total_blocks == 0  # every block free: the slab is gone (its mapping unmapped)
