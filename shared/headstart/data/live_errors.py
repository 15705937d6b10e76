"""Typed errors of the data sessions' live store, and the decorator that raises them."""

from __future__ import annotations

import functools
from typing import Any

import redis

from headstart.engine.errors import HeadstartError, ResourceExhausted


class LiveStoreError(HeadstartError):
    """Redis answered with an error (wrong type, a script error)."""


class LiveStoreUnavailable(LiveStoreError):
    """Redis cannot be reached (connection refused, timeout)."""

    code = "UNAVAILABLE"


class StoreFull(LiveStoreError):
    """Redis is at its `maxmemory` and evicts nothing (`noeviction`, the data store's policy): the
    write was refused whole (a script refused at its first write writes nothing)."""

    code = "STORE_FULL"


class FlashLimitExceeded(ResourceExhausted):
    """The session already has `max_flash` registered questions."""


def as_str(value: Any) -> str:
    """A Redis reply (bytes, or str from a decoding client) as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def guarded(method):
    """Raise the Redis failures of a store method as `LiveStoreUnavailable` / `StoreFull` / `LiveStoreError`."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise LiveStoreUnavailable(f"redis {method.__name__}: {exc}") from exc
        except redis.ResponseError as exc:
            if isinstance(exc, redis.OutOfMemoryError) or str(exc).startswith("OOM "):  # a script's write says it so
                raise StoreFull(f"the data store is full (redis {method.__name__}: {exc})") from exc
            raise LiveStoreError(f"redis {method.__name__}: {exc}") from exc
        except redis.RedisError as exc:
            raise LiveStoreError(f"redis {method.__name__}: {exc}") from exc

    return wrapper
