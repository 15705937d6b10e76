"""The table-cache service as a real gRPC server over a real Redis (random:tiny, float64):
register, precompute with progress, status, invalidation on a changed schema, the
registration client the chart's Job runs, and an engine reading the blocks it wrote."""

from __future__ import annotations

import json
import sqlite3
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from headstart.build import build_runtime
from headstart.config import EngineSettings
from headstart.tables.keys import BlockScope
from headstart.v1 import tablecache_pb2 as pb
from headstart.v1 import tablecache_pb2_grpc
from services.tablecache import register
from services.tablecache.core import TableCacheCore
from services.tablecache.server import SERVICE_NAME, start_server
from services.tablecache.settings import TableCacheSettings

SCHEMA = [
    "CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customer(id), total REAL)",
    "CREATE TABLE product (id INTEGER PRIMARY KEY, title TEXT)",
]
NUM_TABLES, NUM_GROUPS = 3, 2  # pfk: {customer, orders}, {product}
ENGINE = dict(model="random:tiny", dtype="float64", table_cache="pfk", p0_cache_on_disk=False)


def make_db(tmp_path, statements=SCHEMA) -> str:
    # a fresh name per test: the db id (file stem) is part of every block key
    path = tmp_path / f"shop_{uuid.uuid4().hex[:8]}.sqlite"
    with sqlite3.connect(path) as conn:
        for sql in statements:
            conn.execute(sql)
    return str(path)


@pytest.fixture(scope="module")
def service(redis_url):
    core = TableCacheCore(EngineSettings(**ENGINE, table_store_url=redis_url))
    running = start_server(core, TableCacheSettings(host="127.0.0.1", port=0, check_interval_s=0))
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    yield core, channel, tablecache_pb2_grpc.TableCacheStub(channel)
    channel.close()
    running.stop()
    core.close()


def test_health_and_reflection(service):
    _, channel, _ = service
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE_NAME):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answer = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in answer.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


def test_register_precompute_status(service, tmp_path):
    core, _, stub = service
    spec = make_db(tmp_path)
    status = stub.RegisterDatabase(pb.TableCacheDatabaseRef(spec=spec))
    assert (status.num_tables, status.num_groups, status.num_blocks, status.num_bytes, status.complete) == \
        (NUM_TABLES, NUM_GROUPS, 0, 0, False)
    assert (status.model, status.dtype, status.mode) == ("random:tiny@seed0", "float64", "pfk")
    assert status.schema_hash in status.key_prefix

    steps = list(stub.Precompute(pb.TableCachePrecomputeRequest(spec=spec)))
    groups, last = steps[:-1], steps[-1]
    assert [s.group_index for s in groups] == [0, 1] and all(s.num_groups == NUM_GROUPS for s in groups)
    assert sorted(t for s in groups for t in s.tables) == ["customer", "orders", "product"]
    assert not any(s.skipped for s in groups) and all(s.num_tokens > 0 and s.num_bytes > 0 for s in groups)
    assert last.HasField("status") and last.status.complete and last.status.num_blocks == NUM_TABLES
    # stored payloads are the tensors plus their safetensors header
    assert last.status.num_bytes > sum(s.num_bytes for s in groups)

    again = list(stub.Precompute(pb.TableCachePrecomputeRequest(spec=spec)))
    assert [s.skipped for s in again[:-1]] == [True, True]
    forced = list(stub.Precompute(pb.TableCachePrecomputeRequest(spec=spec, force=True)))
    assert [s.skipped for s in forced[:-1]] == [False, False]
    assert stub.GetStatus(pb.TableCacheDatabaseRef(spec=spec)) == last.status
    listed = {d.name: d for d in stub.ListDatabases(pb.TableCacheListRequest()).databases}
    assert listed[spec] == last.status
    # the registry lives in Redis: a second service process sees the registration
    other = TableCacheCore(EngineSettings(**ENGINE, table_store_url=core.settings.table_store_url))
    try:
        assert other.status(spec).num_blocks == NUM_TABLES
    finally:
        other.close()


def test_invalidate_on_a_changed_schema(service, tmp_path):
    core, _, stub = service
    spec = make_db(tmp_path)
    list(stub.Precompute(pb.TableCachePrecomputeRequest(spec=spec)))  # registers, then encodes
    before = stub.GetStatus(pb.TableCacheDatabaseRef(spec=spec))
    assert before.complete

    unchanged = stub.Invalidate(pb.TableCacheDatabaseRef(spec=spec))
    assert (unchanged.changed, unchanged.num_blocks_deleted, unchanged.status.num_blocks) == (False, 0, NUM_TABLES)

    with sqlite3.connect(spec) as conn:
        conn.execute("ALTER TABLE product ADD COLUMN price REAL")
    result = stub.Invalidate(pb.TableCacheDatabaseRef(spec=spec))
    assert result.changed and result.old_schema_hash == before.schema_hash
    assert result.new_schema_hash != before.schema_hash
    assert result.num_blocks_deleted == NUM_TABLES
    old = BlockScope(before.model, before.dtype, before.db_id, before.schema_hash)
    assert core.store.list(old) == []
    assert (result.status.schema_hash, result.status.num_blocks) == (result.new_schema_hash, 0)

    # the periodic check finds the next change by itself and precomputes the new version
    with sqlite3.connect(spec) as conn:
        conn.execute("CREATE TABLE supplier (id INTEGER PRIMARY KEY, name TEXT)")
    changed = core.check_all(precompute=True, grace_s=0)
    assert [c.old_schema_hash for c in changed if c.status.name == spec] == [result.new_schema_hash]
    now = stub.GetStatus(pb.TableCacheDatabaseRef(spec=spec))
    assert (now.num_tables, now.num_blocks, now.complete) == (NUM_TABLES + 1, NUM_TABLES + 1, True)
    stale = BlockScope(before.model, before.dtype, before.db_id, result.new_schema_hash)
    assert core.store.list(stale) == []


@pytest.mark.parametrize("call, request_, code, words", [
    ("RegisterDatabase", pb.TableCacheDatabaseRef(spec="/no/such/file.sqlite"), grpc.StatusCode.INVALID_ARGUMENT,
     "file.sqlite"),
    ("RegisterDatabase", pb.TableCacheDatabaseRef(spec="  "), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    ("GetStatus", pb.TableCacheDatabaseRef(spec="never_registered_db"), grpc.StatusCode.NOT_FOUND,
     "not registered"),
    ("Invalidate", pb.TableCacheDatabaseRef(spec="never_registered_db"), grpc.StatusCode.NOT_FOUND,
     "not registered"),
    ("CleanOrphans", pb.TableCacheCleanOrphansRequest(grace_s=-1), grpc.StatusCode.INVALID_ARGUMENT, "grace_s"),
])
def test_bad_requests_get_typed_errors(service, call, request_, code, words):
    _, _, stub = service
    with pytest.raises(grpc.RpcError) as err:
        getattr(stub, call)(request_, timeout=30)
    assert err.value.code() == code and words in err.value.details()


@pytest.mark.parametrize("field, value", [("mode", "independent"), ("dtype", "bfloat16"), ("model", "other/model")])
def test_precompute_for_another_model_or_mode_is_refused(service, tmp_path, field, value):
    _, _, stub = service
    request = pb.TableCachePrecomputeRequest(spec=make_db(tmp_path), **{field: value})
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Precompute(request, timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and f"{field}={value!r}" in err.value.details()


def test_registration_client_of_the_chart_job(service, tmp_path, capsys):
    core, channel, stub = service
    target = channel._channel.target().decode()
    good = make_db(tmp_path)
    listing = tmp_path / "databases.json"
    listing.write_text(json.dumps([good]))
    assert register.main(["--target", target, "--databases-file", str(listing), "--precompute", "--wait-s", "5"]) == 0
    assert stub.GetStatus(pb.TableCacheDatabaseRef(spec=good)).complete
    out = capsys.readouterr().out
    assert "registered" in out and f"{NUM_TABLES}/{NUM_TABLES} blocks" in out

    listing.write_text(json.dumps([good, str(tmp_path / "missing.sqlite")]))
    assert register.main(["--target", target, "--databases-file", str(listing), "--wait-s", "5"]) == 1
    listing.write_text(json.dumps({"not": "a list"}))
    assert register.main(["--target", target, "--databases-file", str(listing)]) == 2


def test_engine_reads_the_blocks_the_service_wrote(service, tmp_path, redis_url):
    _, _, stub = service
    spec = make_db(tmp_path)
    list(stub.Precompute(pb.TableCachePrecomputeRequest(spec=spec)))
    question = "How many orders has each customer placed?"
    reader = build_runtime(EngineSettings(**ENGINE, table_store_url=redis_url, table_precompute_on_open=False))
    try:
        result = reader.complete(spec, question, "prefix", max_new_tokens=8)
        stats = reader.prefix_source.service.stats()
        # every table came from Redis; only the question was computed
        assert (stats["num_store_hits"], stats["num_misses"]) == (NUM_TABLES, 0)
        layout = reader.prefix_source.layout(spec)
        cached = len(layout.head_ids) + sum(len(t.ids) for t in layout.texts.values())
        assert result.computed_tokens_at_submit == result.prompt_tokens - cached
    finally:
        reader.shutdown()
    # the same tokens as an engine that encodes its own blocks
    local = build_runtime(EngineSettings(**ENGINE, table_store_url="memory://"))
    try:
        assert local.complete(spec, question, "prefix", max_new_tokens=8).token_ids == result.token_ids
    finally:
        local.shutdown()


def test_a_postgres_database_registers_and_precomputes(service, postgres_database):
    import psycopg

    _, _, stub = service
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE region (id integer PRIMARY KEY, name text NOT NULL)")
        conn.execute("CREATE TABLE store (id integer PRIMARY KEY, region_id integer REFERENCES region(id))")
    steps = list(stub.Precompute(pb.TableCachePrecomputeRequest(spec=postgres_database)))
    status = steps[-1].status
    assert (status.num_tables, status.num_groups, status.complete) == (2, 1, True)


@pytest.mark.parametrize("spec, shown", [
    ("postgresql://reader:s3cret@db.example/sales", "postgresql://reader:***@db.example/sales"),
    ("/data/shop.sqlite", "/data/shop.sqlite"),
])
def test_a_dsn_password_is_never_shown(spec, shown):
    assert register.display_name(spec) == shown
