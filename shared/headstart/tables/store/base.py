"""The block store contract: where precomputed table blocks live between processes.

Variants (picked by URL scheme in `registry.open_store`):

    memory://            this process only, bounded by bytes (embedded default,
                         and the CPU tier in front of Redis)
    redis://host:port/db shared by every engine replica and the precompute job

Every method may be called from the engine's prefetch thread and from the
request thread at once: implementations are thread-safe.

Failures: a store raises `StoreUnavailableError` when its backend cannot be
reached and `CorruptBlockError` when stored bytes do not decode. The engine
never calls a remote store bare: `FallbackStore` turns every error into a miss
so the table is computed instead and the request does not fail.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from headstart.tables.block import TableBlock
from headstart.tables.keys import BlockId, BlockScope


class StoreError(RuntimeError):
    """A block store operation failed."""


class StoreUnavailableError(StoreError):
    """The backend cannot be reached (connection refused, timeout)."""


class CorruptBlockError(StoreError):
    """Stored bytes are not a valid block, or not the block asked for."""


class BlockStore(ABC):
    """Get, put, delete and list table blocks by `BlockId`."""

    url: str = ""

    @abstractmethod
    def get(self, block_id: BlockId) -> TableBlock | None:
        """The block, or None when absent.

        Called by the engine's prefetch (load) step for each table the trie
        found in a request and the device tier does not hold.
        """

    @abstractmethod
    def put(self, block: TableBlock) -> None:
        """Store a block, replacing any block with the same id.

        Called by the precompute job once per table, and by a tiered store to
        fill its CPU tier after a remote hit. After `put` returns, `get` and
        `list` see the block (unless a byte bound or TTL dropped it).
        """

    @abstractmethod
    def delete(self, block_id: BlockId) -> bool:
        """Remove a block; True when it was there.

        Called when a schema version is retired or a block is found stale.
        """

    @abstractmethod
    def contains(self, block_id: BlockId) -> bool:
        """Whether `get` would find the block, without transferring it.

        Called by the precompute job to skip tables already stored.
        """

    @abstractmethod
    def list(self, scope: BlockScope) -> list[str]:
        """Table names stored for one (model, dtype, db, schema hash), sorted.

        Called when the table trie of a scope is built and by operators.
        """

    def close(self) -> None:
        """Release connections. Called once when the owning process shuts down."""

    def __enter__(self) -> "BlockStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
