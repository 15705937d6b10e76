"""A KV cache as a block table over the pool (`kv.block_pool`): what every `KVState` holds.

`PagedCache` keeps no tensors of its own: it lists the pool blocks that
hold its tokens (one table for all layers) and how many tokens each layer
holds (the same for all layers, except inside a forward, where the layers
before the running one already hold the new tokens).

- **Append** writes a layer's new keys/values into the table's blocks,
  taking new ones from the pool as the tokens pass a block's end. A block
  another table lists too (a shared P0, a snapshot of a data session's live
  cache) is copied first: shared blocks are never written.
- **Crop** keeps the first tokens and gives the blocks past them back.
- **Share** makes a second table listing the same blocks (no copy): how
  sessions start from a P0 and answers read a live data cache.
- **Attention** reads `segments(layer)`: the cached tokens as a few pieces
  in place (a run of consecutive blocks of one slab is one piece), which
  the runner's kernels take as they are. `keys(layer)`/`values(layer)` are
  joined copies, for code outside the forward (saving a P0, a shift).

A table's blocks go back to the pool when the cache is dropped (the
`BlockTable`'s finalizer; it never waits for the pool's lock, which the
garbage collector may hold on the same thread: `BlockPool.release_later`)
or cropped.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import NamedTuple

import torch

from headstart.engine.kv.block_pool import BlockPool, PoolError, pool_for


class BlockTable:
    """The blocks of one cache and each layer's token count (module doc).

    Held by its cache only and holding nothing back (no reference cycle):
    it is freed, and its blocks go back to the pool, as soon as the cache
    is dropped.

    Every forward reads each layer's pieces and appends to each layer, so
    the runs of consecutive blocks and their views are kept per layer until
    the block list changes (`_version`): a decode step then slices the last
    run and writes one token, as a tensor of its own would."""

    def __init__(self, pool: BlockPool | None = None):
        self.pool: BlockPool | None = None
        self.blocks: list[int] = []  # mutated in place only (the finalizer holds this list), then `_changed`
        self.lengths: list[int] = []  # per layer
        # the first `borrowed` blocks came from another table (`PagedCache.shared`) and are that
        # table's to count; the others this table allocated or copied (its own, see `KVState.nbytes`)
        self.borrowed = 0
        self._version = 0  # bumped whenever `blocks` changes
        self._runs: tuple[int, list[tuple[int, int]]] = (-1, [])  # (version, [(first entry, entries)])
        self._views: dict[int, tuple[int, list]] = {}  # layer -> (version, [(first token, capacity, k, v)])
        if pool is not None:
            self._bind(pool)

    def _bind(self, pool: BlockPool) -> None:
        self.pool = pool
        finalizer = weakref.finalize(self, _release, pool, self.blocks)
        finalizer.atexit = False

    def _changed(self) -> None:
        self._version += 1

    def adopt(self, blocks: list[int]) -> None:
        """List `blocks` (already retained for this table) after the current ones."""
        self.blocks.extend(blocks)
        self._changed()

    def reserve(self, tokens: int, keys: torch.Tensor) -> None:
        """Enough blocks for `tokens` tokens (the pool found from `keys` on first use)."""
        if self.pool is None:
            self._bind(pool_for(keys))
        need = -(-tokens // self.pool.block_tokens) - len(self.blocks)
        if need > 0:
            self.adopt(self.pool.allocate(need, after=self.blocks[-1] if self.blocks else None))

    def writable(self, start: int, end: int) -> None:
        """Copy the shared blocks that tokens start..end-1 fall in (copy on write)."""
        pool, size = self.pool, self.pool.block_tokens
        self.borrowed = min(self.borrowed, start // size)  # written from here on: its own
        for i in range(start // size, -(-end // size)):
            block = self.blocks[i]
            if pool.is_shared(block):
                held = min(size, max(self.lengths) - i * size)
                (copy,) = pool.allocate(1, after=self.blocks[i - 1] if i else None)
                if held > 0:
                    pool.copy_block(block, copy, held)
                self.blocks[i] = copy
                self._changed()
                pool.release([block])

    def trim(self) -> None:
        """Give back the blocks past every layer's tokens."""
        if self.pool is None:
            return
        keep = -(-max(self.lengths, default=0) // self.pool.block_tokens)
        self.borrowed = min(self.borrowed, keep)
        if keep < len(self.blocks):
            dropped = self.blocks[keep:]
            del self.blocks[keep:]
            self._changed()
            self.pool.release(dropped)

    def _run_list(self) -> list[tuple[int, int]]:
        """(first entry, entries) of each run of consecutive blocks of one slab, in order."""
        version, runs = self._runs
        if version != self._version:
            blocks, slab, runs, i = self.blocks, self.pool.slab_blocks, [], 0
            while i < len(blocks):
                j = i + 1
                while j < len(blocks) and blocks[j] == blocks[j - 1] + 1 and blocks[j] // slab == blocks[i] // slab:
                    j += 1
                runs.append((i, j - i))
                i = j
            self._runs = (self._version, runs)
        return runs

    def _layer_views(self, layer: int) -> list:
        """(first token, capacity, keys, values) of each run for `layer`: views of whole runs."""
        cached = self._views.get(layer)
        if cached is None or cached[0] != self._version:
            size = self.pool.block_tokens
            views = []
            for first, count in self._run_list():
                k, v = self.pool.view(layer, self.blocks[first], 0, count * size)
                views.append((first * size, count * size, k, v))
            cached = self._views[layer] = (self._version, views)
        return cached[1]

    def segments(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Layer `layer`'s cached (keys, values) pieces in order, read in place,
        each `[1, kv_heads, tokens, head_dim]`: a run of blocks that follow
        each other in one slab is one piece."""
        length = self.lengths[layer]
        if not length or self.pool is None:
            return []
        pieces = []
        for first, capacity, k, v in self._layer_views(layer):
            if first + capacity <= length:
                pieces.append((k, v))
            else:
                if length > first:
                    pieces.append((k[:, :, :length - first], v[:, :, :length - first]))
                break
        return pieces

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write `[1, kv_heads, n, head_dim]` new keys/values after layer `layer`'s tokens."""
        if keys.shape[0] != 1:
            raise ValueError(f"a paged cache holds one sequence, not a batch of {keys.shape[0]}")
        start, n = self.lengths[layer], keys.shape[-2]
        if not n:
            return
        pool = self.pool
        end = start + n
        if pool is None or end > len(self.blocks) * pool.block_tokens:
            self.reserve(end, keys)
            pool = self.pool
        size, blocks = pool.block_tokens, self.blocks
        if start // size < self.borrowed or any(pool.is_shared(blocks[i]) for i in range(start // size, -(-end // size))):
            self.writable(start, end)
        if keys.shape[1] != pool.kv_heads or keys.shape[-1] != pool.head_dim or keys.dtype != pool.dtype:
            raise PoolError(f"keys of shape {tuple(keys.shape)} ({keys.dtype}) do not fit blocks of "
                            f"{pool.kv_heads} kv heads x {pool.head_dim} ({pool.dtype})")
        grad = torch.is_grad_enabled()  # the pool's tensors are never part of a graph
        with torch.no_grad() if grad else _NO_CONTEXT:
            for first, capacity, k, v in self._layer_views(layer):  # one copy per run the tokens fall in
                lo, hi = max(start, first), min(end, first + capacity)
                if lo == start and hi == end:  # the common case: every new token in one run
                    k[:, :, lo - first:hi - first] = keys
                    v[:, :, lo - first:hi - first] = values
                elif lo < hi:
                    k[:, :, lo - first:hi - first] = keys[:, :, lo - start:hi - start]
                    v[:, :, lo - first:hi - first] = values[:, :, lo - start:hi - start]
        self.lengths[layer] = end


_NO_CONTEXT = contextlib.nullcontext()


def _release(pool: BlockPool, blocks: list[int]) -> None:
    if blocks:  # a finalizer: it may run inside the pool's own locked code (`BlockPool.release_later`)
        pool.release_later(list(blocks))
        blocks.clear()


class LayerKV(NamedTuple):
    """One layer's keys and values `# [1, kv_heads, tokens, head_dim]` (a joined copy)."""

    keys: torch.Tensor | None
    values: torch.Tensor | None


class PagedCache:
    """A cache over pool blocks (module doc). `pool` is found from the first
    keys appended when not given (`block_pool.pool_for`)."""

    def __init__(self, pool: BlockPool | None = None):
        self.table = BlockTable(pool)

    @property
    def pool(self) -> BlockPool | None:
        return self.table.pool

    @property
    def blocks(self) -> list[int]:
        """The table's block ids, in token order (read only)."""
        return self.table.blocks

    @property
    def num_layers(self) -> int:
        return len(self.table.lengths)

    def layer_length(self, layer: int) -> int:
        return self.table.lengths[layer]

    def _ensure_layer(self, layer: int) -> None:
        while len(self.table.lengths) <= layer:
            self.table.lengths.append(0)

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write `[1, kv_heads, n, head_dim]` new keys/values after layer `layer`'s tokens."""
        self._ensure_layer(layer)
        self.table.append(layer, keys, values)

    def segments(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Layer `layer`'s cached (keys, values) pieces in order, read in place
        (`BlockTable.segments`); none for a layer not written yet."""
        if layer >= len(self.table.lengths):
            return []
        return self.table.segments(layer)

    def keys(self, layer: int) -> torch.Tensor | None:
        """Layer `layer`'s keys `[1, kv_heads, tokens, head_dim]`, a joined copy (None: no tokens)."""
        pieces = self.segments(layer)
        return torch.cat([k for k, _ in pieces], dim=-2) if pieces else None

    def values(self, layer: int) -> torch.Tensor | None:
        """Layer `layer`'s values, as `keys`."""
        pieces = self.segments(layer)
        return torch.cat([v for _, v in pieces], dim=-2) if pieces else None

    @property
    def layers(self) -> list["LayerKV"]:
        """Every layer's (keys, values), joined copies: for code outside the
        forward (tests, tools, a P0 saved to disk), never for a forward."""
        return [LayerKV(self.keys(i), self.values(i)) for i in range(self.num_layers)]

    @property
    def num_tokens(self) -> int:
        """Tokens every layer holds."""
        return min(self.table.lengths, default=0)

    def crop_to(self, tokens: int) -> None:
        """Keep the first `tokens` tokens of every layer; the blocks past them go back."""
        lengths = self.table.lengths
        for i, length in enumerate(lengths):
            lengths[i] = min(length, tokens)
        self.table.trim()

    def shared(self) -> "PagedCache":
        """A second table over the same blocks (no copy; module doc)."""
        new = PagedCache(self.pool)
        if self.pool is not None:
            self.pool.retain(self.blocks)
            new.table.adopt(list(self.blocks))
            new.table.borrowed = len(self.blocks)
        new.table.lengths[:] = self.table.lengths
        return new

    def copied(self, tokens: int | None = None) -> "PagedCache":
        """A table over new blocks holding a copy of these tokens (the first `tokens` of them)."""
        new = PagedCache(self.pool)
        for layer, length in enumerate(self.table.lengths):
            left = length if tokens is None else min(tokens, length)
            new._ensure_layer(layer)
            for keys, values in self.segments(layer):
                if left <= 0:
                    break
                new.append(layer, keys[:, :, :left], values[:, :, :left])
                left -= keys.shape[-2]
        return new

    def block_usage(self) -> list[tuple[int, int, bool]]:
        """(block, tokens it holds for this cache, borrowed) for each block of the table
        (borrowed: it came from the table this one was shared from, which counts it)."""
        if self.pool is None:
            return []
        size, held, borrowed = self.pool.block_tokens, self.num_tokens, self.table.borrowed
        return [(block, min(size, held - i * size), i < borrowed) for i, block in enumerate(self.blocks)
                if held > i * size]
