"""Block stores: `memory://`, `redis://`, the fallback and tiered wrappers, `open_store`."""

from headstart.tables.store.base import (
    BlockStore,
    CorruptBlockError,
    StoreError,
    StoreUnavailableError,
)
from headstart.tables.store.fallback import FallbackStore
from headstart.tables.store.memory import MemoryStore
from headstart.tables.store.redis_store import OrphanReport, RedisStore
from headstart.tables.store.registry import STORE_SCHEMES, open_store
from headstart.tables.store.tiered import TieredStore

__all__ = [
    "STORE_SCHEMES",
    "BlockStore",
    "CorruptBlockError",
    "FallbackStore",
    "MemoryStore",
    "OrphanReport",
    "RedisStore",
    "StoreError",
    "StoreUnavailableError",
    "TieredStore",
    "open_store",
]
