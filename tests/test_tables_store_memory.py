"""`memory://` store, the tiered CPU tier, and `open_store` by URL scheme."""

from __future__ import annotations

import pytest

from headstart.tables.store import FallbackStore, MemoryStore, RedisStore, TieredStore, open_store
from tests.tables_blocks import block_bytes, fresh_scope, make_block

SCOPE = fresh_scope()
B = block_bytes(1)


def test_crud_and_list_per_scope():
    store = MemoryStore()
    other = fresh_scope()
    a, b, c = make_block(SCOPE, "a", 1), make_block(SCOPE, "b", 1), make_block(other, "a", 1)
    for blk in (b, a, c):
        store.put(blk)
    assert store.get(SCOPE.block_id("a")) is a and store.get(other.block_id("a")) is c
    assert store.get(SCOPE.block_id("zz")) is None
    assert store.list(SCOPE) == ["a", "b"] and store.list(other) == ["a"]
    assert store.contains(SCOPE.block_id("b")) and not store.contains(SCOPE.block_id("zz"))
    assert store.delete(SCOPE.block_id("b")) is True and store.delete(SCOPE.block_id("b")) is False
    assert (store.list(SCOPE), len(store), store.used_bytes) == (["a"], 2, 2 * B)


@pytest.mark.parametrize(
    ("events", "left", "evictions"),
    [
        ("+a +b +c", "abc", 0),
        ("+a +b +c +d", "bcd", 1),
        ("+a +b +c a +d", "acd", 1),  # a get refreshes a
        ("+a +b +c +a +d", "acd", 1),  # a put replaces and refreshes
        ("+a +b +c +dd", "cd", 2),  # a two-token block needs two places
        ("+a +b +c +dddd", "abc", 0),  # larger than the whole store: rejected
    ],
)
def test_byte_bound_evicts_least_recently_used(events, left, evictions):
    store = MemoryStore(max_bytes=3 * B)
    for ev in events.split():
        if ev[0] == "+":
            store.put(make_block(SCOPE, ev[1], len(ev) - 1))
        else:
            store.get(SCOPE.block_id(ev))
    assert "".join(store.list(SCOPE)) == left
    assert store.num_evictions == evictions
    assert store.num_rejected == int("dddd" in events)
    assert store.used_bytes == sum(b.num_bytes for b in map(store.get, map(SCOPE.block_id, left)))


@pytest.mark.parametrize(
    ("url", "max_bytes"), [("memory://", None), ("memory:///", None), ("memory://?max_bytes=1024", 1024)]
)
def test_memory_urls(url, max_bytes):
    store = open_store(url)
    assert isinstance(store, MemoryStore) and store.max_bytes == max_bytes


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("memcached://x", r"unknown block store scheme 'memcached'.*valid: \['memory', 'redis', 'rediss'\]"),
        ("localhost:6379", "unknown block store scheme 'localhost'"),
        ("memory://?size=3", r"unknown parameters \['size'\]; valid: \['max_bytes'\]"),
        ("memory://?max_bytes=lots", "max_bytes must be an integer"),
        ("memory://host/path", "takes no host"),
        ("redis://127.0.0.1:1/0?ttl=3", r"unknown parameters \['ttl'\]; valid: \['connect_timeout_s'"),
        ("redis://127.0.0.1:1/0?ttl_s=soon", "ttl_s='soon' is not a int"),
        ("redis://127.0.0.1:1/0?ttl_s=0", "ttl_s must be > 0"),
    ],
)
def test_bad_urls(url, match):
    with pytest.raises(ValueError, match=match):
        open_store(url)


def test_open_store_wraps_remote_stores_for_serving():
    url = "redis://127.0.0.1:1/0?max_connections=3&socket_timeout_s=0.5&connect_timeout_s=0.25&ttl_s=60"
    tiered = open_store(url, cpu_tier_bytes=1 << 20)
    assert isinstance(tiered, TieredStore) and isinstance(tiered.near, MemoryStore)
    assert isinstance(tiered.far, FallbackStore) and isinstance(tiered.far.inner, RedisStore)
    redis_store = tiered.far.inner
    assert (redis_store.ttl_s, redis_store.url, tiered.near.max_bytes) == (60, url, 1 << 20)
    assert redis_store._pool.max_connections == 3
    assert redis_store._pool.connection_kwargs["socket_timeout"] == 0.5
    assert redis_store._pool.connection_kwargs["socket_connect_timeout"] == 0.25
    assert isinstance(open_store(url), FallbackStore)
    assert isinstance(open_store(url, fallback=False), RedisStore)


def test_tiered_store_fills_the_near_tier_and_writes_through():
    near, far = MemoryStore(), MemoryStore()
    store = TieredStore(near, far)
    a, b = make_block(SCOPE, "a"), make_block(SCOPE, "b")
    far.put(a)
    store.put(b)
    assert far.list(SCOPE) == ["a", "b"] and near.list(SCOPE) == ["b"]
    assert store.get(SCOPE.block_id("a")) is a and near.list(SCOPE) == ["a", "b"]
    store.get(SCOPE.block_id("a"))
    assert store.get(SCOPE.block_id("zz")) is None
    assert (store.num_near_hits, store.num_far_hits, store.num_misses) == (1, 1, 1)
    assert store.delete(SCOPE.block_id("a")) and not near.contains(SCOPE.block_id("a")) and store.list(SCOPE) == ["b"]
