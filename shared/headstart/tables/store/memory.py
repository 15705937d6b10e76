"""`memory://`: blocks in this process's memory, bounded by bytes, LRU.

The embedded default store (one process, no Redis) and the CPU tier in front
of Redis in each engine process (`TieredStore`). Blocks are kept as decoded
`TableBlock`s on CPU: a hit costs no copy and no decoding. Blocks are shared,
never copied: callers must not write into their tensors.

URL: `memory://` or `memory://?max_bytes=N` (no bound when absent).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import replace
from urllib.parse import parse_qs, urlsplit

from headstart.tables.block import TableBlock
from headstart.tables.keys import BlockId, BlockScope
from headstart.tables.store.base import BlockStore

log = logging.getLogger(__name__)


class MemoryStore(BlockStore):
    """Blocks by key in an LRU dict, at most `max_bytes` of KV tensors in total.

    A block larger than `max_bytes` is not stored (counted in `num_rejected`);
    `put` evicts least recently used blocks to make room (`num_evictions`).
    """

    def __init__(self, max_bytes: int | None = None, *, pin_memory: bool = False) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.pin_memory = pin_memory
        self.url = "memory://" + (f"?max_bytes={max_bytes}" if max_bytes is not None else "")
        self._blocks: OrderedDict[str, TableBlock] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self.num_evictions = 0
        self.num_rejected = 0

    @classmethod
    def from_url(cls, url: str) -> "MemoryStore":
        """Build from `memory://[?max_bytes=N]`.

        Raises:
            ValueError: a host/path is given or a parameter is unknown or not an int.
        """
        parts = urlsplit(url)
        if parts.netloc or parts.path not in ("", "/"):
            raise ValueError(f"{url!r}: memory:// takes no host or path")
        params = parse_qs(parts.query, keep_blank_values=True)
        unknown = set(params) - {"max_bytes"}
        if unknown:
            raise ValueError(f"{url!r}: unknown parameters {sorted(unknown)}; valid: ['max_bytes']")
        if "max_bytes" not in params:
            return cls()
        try:
            return cls(int(params["max_bytes"][-1]))
        except ValueError:
            raise ValueError(f"{url!r}: max_bytes must be an integer") from None

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    def get(self, block_id: BlockId) -> TableBlock | None:
        with self._lock:
            block = self._blocks.get(block_id.key)
            if block is not None:
                self._blocks.move_to_end(block_id.key)
            return block

    def put(self, block: TableBlock) -> None:
        size = block.num_bytes
        if self.max_bytes is not None and size > self.max_bytes:
            with self._lock:
                self.num_rejected += 1
            log.info("memory store: %s (%d bytes) exceeds max_bytes %d", block.table, size, self.max_bytes)
            return
        if self.pin_memory and not block.keys_pre_rope.is_pinned():
            block = _pinned(block)
        key = block.key
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self._used -= old.num_bytes
            while self.max_bytes is not None and self._used + size > self.max_bytes:
                _, victim = self._blocks.popitem(last=False)
                self._used -= victim.num_bytes
                self.num_evictions += 1
            self._blocks[key] = block
            self._used += size

    def delete(self, block_id: BlockId) -> bool:
        with self._lock:
            block = self._blocks.pop(block_id.key, None)
            if block is None:
                return False
            self._used -= block.num_bytes
            return True

    def contains(self, block_id: BlockId) -> bool:
        with self._lock:
            return block_id.key in self._blocks

    def list(self, scope: BlockScope) -> list[str]:
        with self._lock:
            return sorted(b.table for b in self._blocks.values() if b.block_id.scope == scope)


def _pinned(block: TableBlock) -> TableBlock:
    """The block with page-locked tensors, so device copies can be asynchronous."""
    return replace(block, keys_pre_rope=block.keys_pre_rope.pin_memory(), values=block.values.pin_memory())
