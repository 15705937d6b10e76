"""Open a block store by URL scheme: `memory://`, `redis://`, `rediss://`.

`open_store(url)` is called once, where the engine or the precompute job is
built from its settings. For a remote store it also adds what the engine
wants in front of it: `FallbackStore` (a failure is a miss, never an error)
and, when `cpu_tier_bytes` is set, a per-process CPU tier (`TieredStore`).
The precompute job passes `fallback=False` to see failures.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from headstart.tables.store.base import BlockStore
from headstart.tables.store.fallback import FallbackStore
from headstart.tables.store.memory import MemoryStore
from headstart.tables.store.tiered import TieredStore


def _redis_store(url: str) -> BlockStore:
    # NOTE: imported here: the engine library runs without the redis client where no redis:// store is used
    from headstart.tables.store.redis_store import RedisStore

    return RedisStore.from_url(url)


STORE_SCHEMES: dict[str, Callable[[str], BlockStore]] = {
    "memory": MemoryStore.from_url,
    "redis": _redis_store,
    "rediss": _redis_store,
}


def open_store(
    url: str,
    *,
    cpu_tier_bytes: int | None = None,
    fallback: bool = True,
    retry_after_s: float = 5.0,
) -> BlockStore:
    """The store for `url`, wrapped for serving.

    Args:
        url: `memory://[?max_bytes=N]` or `redis://host:port/db[?params]`
            (parameters: `RedisStore`).
        cpu_tier_bytes: size of a CPU-memory tier in front of a remote store
            (None or 0: none). Ignored for `memory://`.
        fallback: turn a remote store's failures into misses.
        retry_after_s: after a failure, answer misses without trying this long.

    Raises:
        ValueError: unknown scheme (the message lists the valid ones) or bad parameters.
    """
    scheme = urlsplit(url).scheme
    factory = STORE_SCHEMES.get(scheme)
    if factory is None:
        raise ValueError(f"unknown block store scheme {scheme!r} in {url!r}; valid: {sorted(STORE_SCHEMES)}")
    store = factory(url)
    if isinstance(store, MemoryStore):
        return store
    if fallback:
        store = FallbackStore(store, retry_after_s=retry_after_s)
    if cpu_tier_bytes:
        store = TieredStore(MemoryStore(cpu_tier_bytes), store)
    return store
