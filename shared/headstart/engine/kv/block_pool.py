"""The KV block pool: every cached key and value of a process, in fixed-size blocks.

A cache (`paged_cache.PagedCache`) is a block table: the ids of the blocks that
hold its tokens, in order, `block_tokens` tokens each (the last one partly
filled). vLLM's PagedAttention and nano-vllm's `BlockManager` keep KV memory
the same way, and for the same reasons:

- **Sharing by reference.** Sessions on one database start from the same P0
  (system prompt and schema): their tables list P0's blocks, counted once.
  A block listed by more than one table is never written: a cache about to
  write into one copies it first (copy on write), so a session's typing,
  a data session's ingestion or an answer-ahead never changes what another
  cache reads.
- **No re-concatenation.** A cache grows by writing its new tokens into its
  last block and new ones; a crop gives the blocks past the kept tokens
  back. Nothing is joined per extension.
- **One count of memory.** Used, shared and free blocks are the pool's own
  numbers (`PoolStats`), which Describe and `/metrics` report.
- **Memory back to the system.** A slab whose blocks are all free is
  dropped; the pages of free blocks in slabs still in use are given back
  by `give_back_free_pages` (an idle replica's heap trim calls it), so a
  burst's KV does not stay resident.

Layout. Blocks live in slabs of `slab_blocks` blocks: per slab, per layer,
one keys and one values view `[kv_heads, slab_blocks * block_tokens,
head_dim]` of one allocation (each head's tokens padded: `SLAB_PAD_TOKENS`),
so a block is a token range of its slab and blocks with
consecutive ids in one slab are one contiguous range per head: a cache's
run of them reads as one piece, which the attention kernels take in place
(`PagedCache.segments`). A slab's layer tensors are made on first
write; a slab whose blocks are all free is dropped, so memory goes back.

One pool per layout (device, dtype, kv heads, head dim): `pool_for` finds or
makes it, so every cache of one model in a process draws from one pool (the
`ModelRunner` reports it). Allocation and counts take a lock: a cache may be
dropped on any thread (its finalizer never waits for the lock: `release_later`).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import ctypes.util
import functools
import logging
import mmap
import threading
import warnings
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

DEFAULT_BLOCK_TOKENS = 64  # tokens per block: crop and sharing granularity
DEFAULT_SLAB_BLOCKS = 64  # blocks per slab (4,096 tokens): the unit of allocation from the system
# A head's tokens in a slab are followed by this many unused ones: with a power-of-two stride
# between heads (4,096 tokens x 256 bytes = 1 MiB for the 0.5B) and between keys and values,
# the attention kernel's reads of one position in every head and both tensors fall in the same
# cache sets, and the kernel slows down by a fifth or more.
SLAB_PAD_TOKENS = 1


class PoolError(RuntimeError):
    """A block pool was used against its rules (a bug in the caller, never user input)."""


@dataclass(frozen=True)
class PoolStats:
    """The pool's blocks at one moment (`BlockPool.stats`)."""

    block_tokens: int
    block_bytes: int  # keys and values of one block, every layer
    total_blocks: int  # blocks of the slabs that exist
    used_blocks: int  # listed by at least one cache
    shared_blocks: int  # listed by more than one cache

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks

    @property
    def used_bytes(self) -> int:
        return self.used_blocks * self.block_bytes


class BlockPool:
    """Fixed-size KV blocks of one layout, reference-counted (module doc).

    Args:
        kv_heads, head_dim, dtype, device: the layout every block holds.
        block_tokens: tokens per block.
        slab_blocks: blocks per slab (allocated from the system together).
    """

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 block_tokens: int = DEFAULT_BLOCK_TOKENS, slab_blocks: int = DEFAULT_SLAB_BLOCKS):
        if block_tokens < 1 or slab_blocks < 1:
            raise ValueError(f"block_tokens and slab_blocks must be >= 1, not {block_tokens}, {slab_blocks}")
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, dtype
        self.device = torch.device(device)
        self.block_tokens, self.slab_blocks = block_tokens, slab_blocks
        self._lock = threading.Lock()
        # blocks of tables dropped while the lock was busy (`release_later`), freed by its next holder
        self._pending: collections.deque[list[int]] = collections.deque()
        # per slab: per layer (keys, values) [kv_heads, slab_blocks * block_tokens, head_dim], or None (no tensors)
        self._slabs: list[list[tuple[torch.Tensor, torch.Tensor] | None] | None] = []
        self._refs: list[int] = []  # per block id
        self._free: list[int] = []  # sorted free ids
        self._num_layers = 0  # the most layers written so far (block_bytes)

    # ---- allocation (the lock) ----

    @contextlib.contextmanager
    def _held(self):
        """The lock, with the releases that waited for it done first."""
        with self._lock:
            self._drain()
            yield

    def _drain(self) -> None:
        while self._pending:
            blocks = self._pending.popleft()
            try:
                self._release_held(blocks)
            except PoolError:  # a bug of a table long gone: not the error of whoever takes the lock now
                log.exception("a dropped table's blocks could not be released")

    def allocate(self, count: int, after: int | None = None) -> list[int]:
        """`count` free blocks, each held once. Blocks right after `after` (the
        caller's last block) are taken when free and in its slab, so a table's
        blocks stay one run; otherwise the lowest free ids."""
        if count <= 0:
            return []
        with self._held():
            if after is not None:
                run = list(range(after + 1, after + 1 + count))
                if run[-1] < len(self._refs) and run[-1] // self.slab_blocks == after // self.slab_blocks \
                        and all(self._refs[b] == 0 for b in run):
                    return self._take(run)
            while len(self._free) < count:
                self._grow()
            return self._take(self._free[:count])

    def _take(self, ids: list[int]) -> list[int]:
        for block in ids:
            self._refs[block] = 1
            del self._free[bisect.bisect_left(self._free, block)]
            slab = block // self.slab_blocks
            if self._slabs[slab] is None:
                self._slabs[slab] = []
        return ids

    def _grow(self) -> None:
        first = len(self._refs)
        self._slabs.append(None)
        self._refs.extend([0] * self.slab_blocks)
        self._free.extend(range(first, first + self.slab_blocks))

    def retain(self, blocks: list[int]) -> None:
        """Another table lists these blocks."""
        with self._held():
            for block in blocks:
                if self._refs[block] <= 0:
                    raise PoolError(f"block {block} is free: it cannot be shared")
                self._refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        """A table no longer lists these blocks; a block no table lists is free,
        and a slab whose blocks are all free gives its memory back."""
        with self._held():
            self._release_held(blocks)

    def release_later(self, blocks: list[int]) -> None:
        """`release`, for a finalizer: never waits for the lock. A table is
        dropped wherever its last reference goes, and the garbage collector may
        drop one inside this pool's own locked code on the same thread (any
        allocation there can start a collection); waiting for the lock would
        then hang that thread for good (a replica stopped answering, found by
        `bench serve`). So the blocks are queued, and freed now if the lock is
        free, else by its holder or next taker."""
        self._pending.append(blocks)
        if self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def _release_held(self, blocks: list[int]) -> None:
        freed = []
        for block in blocks:
            if self._refs[block] <= 0:
                raise PoolError(f"block {block} is already free")
            self._refs[block] -= 1
            if not self._refs[block]:
                bisect.insort(self._free, block)
                freed.append(block)
        for slab in {block // self.slab_blocks for block in freed}:
            start = slab * self.slab_blocks
            if not any(self._refs[start:start + self.slab_blocks]):
                self._slabs[slab] = None  # its own mapping: unmapped with its tensors (`_slab_tensor`)
            elif self._slabs[slab]:  # the slab stays: its freed blocks' pages go back now, not at an idle trim
                self._give_back(slab, _runs(sorted(b - start for b in freed if b // self.slab_blocks == slab)))

    def is_shared(self, block: int) -> bool:
        """Whether more than one table lists the block (it must not be written)."""
        return self._refs[block] > 1

    def refs(self, block: int) -> int:
        return self._refs[block]

    def stats(self) -> PoolStats:
        with self._held():
            used = sum(1 for r in self._refs if r)
            shared = sum(1 for r in self._refs if r > 1)
            total = sum(self.slab_blocks for slab in self._slabs if slab is not None)
        return PoolStats(self.block_tokens, self.block_bytes, total, used, shared)

    @property
    def token_bytes(self) -> int:
        """Keys and values of one token, every layer written so far."""
        return 2 * self._num_layers * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.token_bytes

    # ---- the blocks' contents (callers hold the blocks) ----

    def _layer(self, block: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The slab tensors of `block`'s slab for `layer`, made on first use."""
        slab = self._slabs[block // self.slab_blocks]
        if slab is None:
            raise PoolError(f"block {block} is free: it holds nothing")
        if len(slab) > layer and slab[layer] is not None:
            return slab[layer]
        with self._lock:  # made once: two caches writing their first tokens of a slab's layer
            while len(slab) <= layer:
                slab.append(None)
            if slab[layer] is None:
                tokens = self.slab_blocks * self.block_tokens
                # normal tensors, not inference tensors (a slab made inside `inference_mode` would be one):
                # blocks are written both inside and outside it
                with torch.inference_mode(False):
                    both = _slab_tensor((2, self.kv_heads, tokens + SLAB_PAD_TOKENS, self.head_dim),
                                        self.dtype, self.device)
                slab[layer] = (both[0, :, :tokens], both[1, :, :tokens])
                self._num_layers = max(self._num_layers, layer + 1)
            return slab[layer]

    def view(self, layer: int, block: int, offset: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values `[1, kv_heads, tokens, head_dim]` from token `offset` of
        `block` on: may run on into the next blocks of its slab (a run)."""
        keys, values = self._layer(block, layer)
        start = (block % self.slab_blocks) * self.block_tokens + offset
        if start + tokens > keys.shape[1]:
            raise PoolError(f"a view of {tokens} tokens from block {block} runs past its slab")
        return keys[None, :, start:start + tokens], values[None, :, start:start + tokens]

    def write(self, layer: int, block: int, offset: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write `[1, kv_heads, n, head_dim]` keys/values at token `offset` of
        `block` on (into the next blocks of its slab, as `view`)."""
        if keys.shape[1] != self.kv_heads or keys.shape[-1] != self.head_dim:
            raise PoolError(f"keys of shape {tuple(keys.shape)} do not fit blocks of {self.kv_heads} kv heads "
                            f"x {self.head_dim}")
        k, v = self.view(layer, block, offset, keys.shape[-2])
        with torch.no_grad():
            k.copy_(keys)
            v.copy_(values)

    def give_back_free_pages(self) -> int:
        """Tell the system the pages of free blocks (in slabs still in use)
        hold nothing (`madvise(MADV_DONTNEED)`; CPU memory on Linux only): a
        burst's blocks, freed, no longer count in the process's RSS, and a
        block taken again starts on fresh zero pages. malloc_trim cannot do
        this: the slab is one live allocation. Returns the bytes given back.

        Holds the pool's lock throughout, so no free block is allocated (and
        written) while its pages are dropped; blocks in use are never touched."""
        with self._held():
            return sum(self._give_back(index, _free_runs(self._refs[index * self.slab_blocks:
                                                                    (index + 1) * self.slab_blocks]))
                       for index, slab in enumerate(self._slabs) if slab)

    def _give_back(self, slab: int, runs: list[tuple[int, int]]) -> int:
        """madvise(MADV_DONTNEED) the whole pages of the runs [lo, hi) of free blocks of `slab` in
        every layer and head (the lock held); the bytes given back (0: not CPU, or not Linux)."""
        madvise = _libc_madvise()
        if madvise is None or self.device.type != "cpu":
            return 0
        page, given = mmap.PAGESIZE, 0
        for lo, hi in runs:
            for tensors in self._slabs[slab]:
                for t in tensors or ():
                    per_head = t.stride(0) * t.element_size()
                    per_block = self.block_tokens * t.stride(1) * t.element_size()
                    for head in range(t.shape[0]):
                        start = t.data_ptr() + head * per_head + lo * per_block
                        end = (start + (hi - lo) * per_block) // page * page
                        start = -(-start // page) * page  # whole pages inside the range only
                        if end > start and madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start),
                                                   _MADV_DONTNEED) == 0:
                            given += end - start
        return given

    def copy_block(self, source: int, target: int, tokens: int) -> None:
        """Copy the first `tokens` tokens of every layer written in `source` into `target`."""
        slab = self._slabs[source // self.slab_blocks]
        for layer in range(len(slab) if slab is not None else 0):
            if slab[layer] is not None:
                k, v = self.view(layer, source, 0, tokens)
                self.write(layer, target, 0, k, v)


_MADV_DONTNEED = 4  # Linux


@functools.cache
def _libc_madvise():
    """The C library's `madvise`, or None (not Linux, or no C library found)."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        fn = getattr(ctypes.CDLL(name, use_errno=True), "madvise", None) if name else None
    except OSError:
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def _slab_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A slab layer's tensor. On the CPU, in an anonymous mapping of its own: its pages are
    resident only once written, and it is unmapped when the tensor goes (torch's allocator
    would take a few MiB from glibc, whose arenas keep a dropped slab's memory from the system)."""
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    count = 1
    for n in shape:
        count *= n
    # NOTE: private: Python's default (MAP_SHARED) is shared memory, whose pages madvise cannot free
    mapping = mmap.mmap(-1, count * torch.empty((), dtype=dtype).element_size(),
                        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with warnings.catch_warnings():  # "non-writable buffer" is not said of a writable mapping; kept quiet anyway
        warnings.simplefilter("ignore")
        return torch.frombuffer(mapping, dtype=dtype).view(shape)  # the tensor holds the mapping


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """(first, end) of each run of consecutive ids in sorted `ids`."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _free_runs(refs: list[int]) -> list[tuple[int, int]]:
    """(first, end) of each run of free blocks (count 0) in a slab's counts."""
    runs, start = [], None
    for i, count in enumerate([*refs, 1]):
        if not count and start is None:
            start = i
        elif count and start is not None:
            runs.append((start, i))
            start = None
    return runs


def give_back_free_pages() -> int:
    """`BlockPool.give_back_free_pages` for every pool of the process; the bytes given back."""
    return sum(pool.give_back_free_pages() for pool in pools())


_POOLS: dict[tuple, BlockPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(keys: torch.Tensor) -> BlockPool:
    """The process's pool for caches of `keys`' layout (`[1, kv_heads, tokens,
    head_dim]`, its dtype and device): one per layout, made on first use."""
    layout = (keys.device, keys.dtype, keys.shape[1], keys.shape[-1])
    with _POOLS_LOCK:
        pool = _POOLS.get(layout)
        if pool is None:
            pool = _POOLS[layout] = BlockPool(keys.shape[1], keys.shape[-1], keys.dtype, keys.device)
        return pool


def pools() -> list[BlockPool]:
    """Every pool of this process (what a replica's metrics sum)."""
    with _POOLS_LOCK:
        return list(_POOLS.values())
