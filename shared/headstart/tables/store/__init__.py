"""Block stores: `memory://`, `redis://`, the fallback and tiered wrappers, `open_store`.

`RedisStore` and `OrphanReport` load the redis client on first use (PEP 562), so the engine
library imports without it where no `redis://` store is opened."""

from headstart.tables.store.base import (
    BlockStore,
    CorruptBlockError,
    StoreError,
    StoreUnavailableError,
)
from headstart.tables.store.fallback import FallbackStore
from headstart.tables.store.memory import MemoryStore
from headstart.tables.store.registry import STORE_SCHEMES, open_store
from headstart.tables.store.tiered import TieredStore



def __getattr__(name: str):
    if name in ("OrphanReport", "RedisStore"):
        from headstart.tables.store import redis_store

        return getattr(redis_store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
