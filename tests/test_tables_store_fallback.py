"""Redis down: lookups become misses (the caller computes), counted, and recover after a restart."""

from __future__ import annotations

import pytest

from headstart.tables.store import FallbackStore, MemoryStore, RedisStore, StoreError, open_store
from tests.tables_blocks import fresh_scope, make_block


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_redis_down_serves_misses_then_recovers(redis_restartable):
    clock = Clock()
    store = FallbackStore(RedisStore(redis_restartable.url, connect_timeout_s=0.5), retry_after_s=5, clock=clock)
    scope = fresh_scope()
    block = make_block(scope, "singer")
    store.put(block)
    assert store.get(block.block_id) is not None and store.num_errors == 0

    redis_restartable.stop()
    assert store.get(block.block_id) is None  # a miss, not an exception
    assert (store.num_errors, store.num_skipped, store.is_open) == (1, 0, True)
    assert (store.contains(block.block_id), store.list(scope), store.delete(block.block_id)) == (False, [], False)
    store.put(block)  # dropped
    assert (store.num_errors, store.num_skipped) == (1, 4)  # the circuit is open: nothing tried

    clock.now = 6.0
    assert store.get(block.block_id) is None  # tried again, still down
    assert (store.num_errors, store.num_skipped) == (2, 4)

    redis_restartable.start()
    clock.now = 12.0
    assert store.get(block.block_id) is None  # back, but the restarted server is empty
    assert store.is_open is False
    store.put(block)
    assert store.get(block.block_id) is not None
    assert (store.num_errors, store.num_skipped) == (2, 4)
    store.close()


def test_cpu_tier_keeps_serving_while_redis_is_down(redis_restartable):
    store = open_store(redis_restartable.url, cpu_tier_bytes=1 << 20)
    scope = fresh_scope()
    cached, uncached = make_block(scope, "singer"), make_block(scope, "concert")
    store.put(cached)
    store.far.put(uncached)
    store.near.delete(uncached.block_id)
    redis_restartable.stop()
    assert store.get(cached.block_id) is not None
    assert store.get(uncached.block_id) is None
    assert store.far.num_errors == 1
    store.close()


class Broken(MemoryStore):
    def get(self, block_id):
        raise StoreError("corrupt")

    def list(self, scope):
        raise KeyError("a bug")


@pytest.mark.parametrize("call", ["get", "list"])
def test_any_error_becomes_a_miss(call):
    store = FallbackStore(Broken())
    scope = fresh_scope()
    result = store.get(scope.block_id("a")) if call == "get" else store.list(scope)
    assert result in (None, []) and store.num_errors == 1
