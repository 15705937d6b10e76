"""The Redis block store against a real redis-server (started by the `redis_url` fixture)."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from headstart.tables.block_codec import encode_block
from headstart.tables.store import CorruptBlockError, RedisStore, StoreUnavailableError, open_store
from tests.tables_blocks import fresh_scope, make_block


@pytest.fixture
def store(redis_url):
    s = RedisStore.from_url(redis_url)
    yield s
    s.close()


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_round_trip_list_delete(store):
    scope = fresh_scope()
    a, b = make_block(scope, "singer", 4, seed=1), make_block(scope, "concert", 2, seed=2)
    store.put(a)
    store.put(b)
    got = store.get(scope.block_id("singer"))
    assert got.block_id == a.block_id and got.token_ids == a.token_ids
    assert got.keys_pre_rope.equal(a.keys_pre_rope) and got.values.equal(a.values)
    assert store.list(scope) == ["concert", "singer"]
    assert store.contains(scope.block_id("concert")) and not store.contains(scope.block_id("stadium"))
    assert store.get(scope.block_id("stadium")) is None
    assert store.delete(scope.block_id("concert")) is True and store.delete(scope.block_id("concert")) is False
    assert store.list(scope) == ["singer"] and store.list(fresh_scope()) == []


def test_index_is_a_hash_of_table_to_key(store, client):
    scope = fresh_scope()
    block = make_block(scope, "odd name/with:colons")
    store.put(block)
    assert client.hgetall(scope.index_key) == {b"odd name/with:colons": block.key.encode()}
    assert client.get(block.key) == encode_block(block)
    assert store.list(scope) == ["odd name/with:colons"]


def test_payload_is_written_before_the_index_entry(store, monkeypatch):
    """A put that dies between its two writes leaves a payload, never a dangling index entry."""
    scope = fresh_scope()

    def crash(*a, **k):
        raise redis.ConnectionError("connection lost")

    monkeypatch.setattr(store._client, "pipeline", crash)
    with pytest.raises(StoreUnavailableError, match="connection lost"):
        store.put(make_block(scope, "singer"))
    monkeypatch.undo()
    assert store.contains(scope.block_id("singer")) and store.list(scope) == []
    report = store.clean_orphans(scope, grace_s=0)
    assert (report.num_index_entries_removed, report.num_payloads_removed) == (0, 1)
    assert not store.contains(scope.block_id("singer"))


@pytest.mark.parametrize("ttl_s", [None, 120])
def test_ttl_applies_to_payload_and_index(redis_url, client, ttl_s):
    store = RedisStore.from_url(redis_url + (f"?ttl_s={ttl_s}" if ttl_s else ""))
    scope = fresh_scope()
    store.put(make_block(scope, "singer"))
    ttls = [client.ttl(scope.block_id("singer").key), client.ttl(scope.index_key)]
    if ttl_s is None:
        assert ttls == [-1, -1]
    else:
        assert all(ttl_s - 5 <= t <= ttl_s for t in ttls)
    store.close()


def test_clean_orphans(store, client):
    scope = fresh_scope()
    for table in ("a", "b", "c"):
        store.put(make_block(scope, table))
    client.delete(scope.block_id("a").key)  # index entry without payload (expired, evicted)
    client.hdel(scope.index_key, "b")  # payload without index entry (a crashed put)
    young = store.clean_orphans(scope, grace_s=3600)  # b may be a put in flight: kept
    assert (young.num_index_entries_removed, young.num_payloads_removed, young.num_payloads_kept_young) == (1, 0, 1)
    assert store.list(scope) == ["c"] and store.contains(scope.block_id("b"))
    old = store.clean_orphans(scope, grace_s=0)
    assert (old.num_index_entries_removed, old.num_payloads_removed) == (0, 1)
    assert not store.contains(scope.block_id("b")) and store.get(scope.block_id("c")) is not None


def test_clean_orphans_leaves_other_scopes_alone(store, client):
    mine, theirs = fresh_scope(), fresh_scope()
    store.put(make_block(mine, "a"))
    store.put(make_block(theirs, "a"))
    client.hdel(mine.index_key, "a")
    client.hdel(theirs.index_key, "a")
    assert store.clean_orphans(mine, grace_s=0).num_payloads_removed == 1
    assert store.contains(theirs.block_id("a"))


def test_corrupt_or_misplaced_payloads_raise(store, client):
    scope = fresh_scope()
    client.set(scope.block_id("junk").key, b"not a block")
    with pytest.raises(CorruptBlockError, match="too short|does not fit"):
        store.get(scope.block_id("junk"))
    client.set(scope.block_id("moved").key, encode_block(make_block(scope, "other")))
    with pytest.raises(CorruptBlockError, match="holds the block of"):
        store.get(scope.block_id("moved"))


def test_bfloat16_blocks_survive(store):
    import torch

    scope = fresh_scope(torch.bfloat16)
    block = make_block(scope, "singer", 5, dtype=torch.bfloat16)
    block = dataclasses.replace(block, group_tables=("stadium", "singer"))
    store.put(block)
    got = store.get(block.block_id)
    assert got.keys_pre_rope.dtype == torch.bfloat16 and got.keys_pre_rope.equal(block.keys_pre_rope)
    assert got.group_tables == ("stadium", "singer")


def test_unreachable_server_raises_store_unavailable():
    store = RedisStore("redis://127.0.0.1:1/0", connect_timeout_s=0.2)
    assert store.ping() is False
    with pytest.raises(StoreUnavailableError):
        store.get(fresh_scope().block_id("a"))


def test_open_store_against_real_redis(redis_url):
    store = open_store(redis_url, cpu_tier_bytes=1 << 20)
    scope = fresh_scope()
    store.put(make_block(scope, "singer"))
    assert store.get(scope.block_id("singer")) is not None
    assert store.far.inner.list(scope) == ["singer"]  # written through to Redis
    store.close()
