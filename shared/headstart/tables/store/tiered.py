"""`TieredStore`: a process-local CPU tier in front of a shared store.

Each engine process keeps recently used blocks in CPU memory (`MemoryStore`,
bounded by bytes) in front of Redis. `get` tries the CPU tier, then the
shared store, and keeps a shared hit in the CPU tier; `put` writes through to
both (shared first). Counters `num_near_hits`, `num_far_hits`, `num_misses`.
"""

from __future__ import annotations

import threading

from headstart.tables.block import TableBlock
from headstart.tables.keys import BlockId, BlockScope
from headstart.tables.store.base import BlockStore


class TieredStore(BlockStore):
    """`near` (CPU memory) in front of `far` (shared; usually a FallbackStore over Redis)."""

    def __init__(self, near: BlockStore, far: BlockStore) -> None:
        self.near = near
        self.far = far
        self.url = far.url
        self._lock = threading.Lock()
        self.num_near_hits = 0
        self.num_far_hits = 0
        self.num_misses = 0

    def _count(self, attr: str) -> None:
        with self._lock:
            setattr(self, attr, getattr(self, attr) + 1)

    def get(self, block_id: BlockId) -> TableBlock | None:
        block = self.near.get(block_id)
        if block is not None:
            self._count("num_near_hits")
            return block
        block = self.far.get(block_id)
        if block is None:
            self._count("num_misses")
            return None
        self._count("num_far_hits")
        self.near.put(block)
        return block

    def put(self, block: TableBlock) -> None:
        self.far.put(block)
        self.near.put(block)

    def delete(self, block_id: BlockId) -> bool:
        far = self.far.delete(block_id)
        near = self.near.delete(block_id)
        return far or near

    def contains(self, block_id: BlockId) -> bool:
        return self.near.contains(block_id) or self.far.contains(block_id)

    def list(self, scope: BlockScope) -> list[str]:
        return sorted(set(self.far.list(scope)) | set(self.near.list(scope)))

    def close(self) -> None:
        self.far.close()
        self.near.close()
