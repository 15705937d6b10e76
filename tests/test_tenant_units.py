"""Tenant safety logic without servers: the catalogue, password scrubbing, shares,
work budgets, per-tenant slots, bounded Runs, never-raising gRPC deserializers."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from headstart.client.errors import ApiError
from headstart.schema.catalogue import Catalogue, UnknownDatabase, parse_postgres_aliases
from headstart.schema.dsn import scrub_password
from headstart.v1 import headstart_pb2
from services.engine.guard import EngineGuard, EngineUnauthenticated
from services.gateway.databases import RunLimits, run_read_only
from services.gateway.grpc_wire import Malformed, TooLarge, _safe, checked
from services.gateway.limits import TenantWorkBudget, new_chars
from services.gateway.settings import GatewaySettings
from services.gateway.tenancy import TenantConnections, TenantSlots, connection_share, session_share


@pytest.fixture
def roots(tmp_path):
    inside, outside = tmp_path / "dbs", tmp_path / "elsewhere"
    (inside / "team").mkdir(parents=True)
    outside.mkdir()
    for path in (inside / "sales.sqlite", inside / "team" / "hr.db", outside / "secret.sqlite"):
        sqlite3.connect(path).close()
    (inside / "escape.sqlite").symlink_to(outside / "secret.sqlite")
    return inside, outside


def test_catalogue_names_map_to_operator_specs_only(roots):
    inside, outside = roots
    catalogue = Catalogue(spider_dir=inside, sqlite_roots=[inside], postgres={"prod": "postgresql://u:pw@db/x"})
    assert [e.name for e in catalogue.entries()] == ["prod", "sales", "team/hr"]
    assert catalogue.spec("sales") == str(inside.resolve() / "sales.sqlite")
    assert catalogue.spec("prod") == "postgresql://u:pw@db/x"
    assert "pw" not in repr(catalogue.entry("prod"))
    messages = set()
    for name in (str(inside / "sales.sqlite"), str(outside / "secret.sqlite"), "escape", "/etc/passwd",
                 "../elsewhere/secret", "postgresql://u:pw@db/x", "nope", 7, "x" * 600):
        with pytest.raises(UnknownDatabase) as err:
            catalogue.spec(name)
        messages.add(str(err.value).split("'")[0])
    assert messages == {"unknown database "}


def test_catalogue_from_env_and_rescan(roots, tmp_path):
    inside, _ = roots
    env = {"HEADSTART_CATALOGUE_SQLITE_ROOTS": str(inside), "HEADSTART_CATALOGUE_SPIDER": "0",
           "HEADSTART_CATALOGUE_POSTGRES": "a=postgresql://h/a b=postgres://h/b"}
    catalogue = Catalogue.from_env(environ=env)
    assert {e.name for e in catalogue.entries()} == {"a", "b", "sales", "team/hr"}
    with pytest.raises(ValueError):
        parse_postgres_aliases("nodsn")


@pytest.mark.parametrize("text, dsn, scrubbed", [
    ("a connection at postgresql://u:a@h/db failed as a", "postgresql://u:a@h/db",
     "a connection at postgresql://u:***@h/db failed as a"),  # one-letter password: only where it is one
    ("saw password=a here", "host=h password=a", "saw password=*** here"),
    ("auth failed for hunter2", "postgresql://u:hunter2@h/db", "auth failed for ***"),
    ("hunter22 is not hunter2x", "postgresql://u:hunter2@h/db", "hunter22 is not hunter2x"),
])
def test_scrub_password_masks_password_shaped_places_only(text, dsn, scrubbed):
    assert scrub_password(text, dsn) == scrubbed


def test_engine_guard_checks_the_secret():
    guard = EngineGuard("s3cret", Catalogue(include_spider=False))
    guard.check([("headstart-engine-secret", "s3cret")])
    for metadata in ([], [("headstart-engine-secret", "s3cre")], [("other", "s3cret")]):
        with pytest.raises(EngineUnauthenticated):
            guard.check(metadata)
    with pytest.raises(EngineUnauthenticated):  # none configured: fail closed
        EngineGuard(None, Catalogue(include_spider=False)).check([("headstart-engine-secret", "")])


@pytest.mark.parametrize("capacity, tokens, cap, share", [
    (128, {"a": "alice", "b": "bob"}, 256, 64),
    (8, {"a": "alice", "b": "bob", "c": "carol"}, 256, 2),
    (0, {"a": "alice"}, 256, 256),
    (128, {}, 10, 10),
])
def test_session_share_adds_up_to_capacity(capacity, tokens, cap, share):
    settings = GatewaySettings(engine_capacity=capacity, tokens=tokens, max_sessions_per_tenant=cap)
    assert session_share(settings) == share


@pytest.mark.parametrize("capacity, tokens, cap, share", [
    (128, {"a": "alice", "b": "bob"}, 512, 128),  # 2 x the session share of 64
    (8, {"a": "alice", "b": "bob", "c": "carol"}, 512, 4),
    (0, {"a": "alice"}, 512, 512),  # no capacity: 2 x max_sessions_per_tenant (256)
    (128, {"a": "alice", "b": "bob"}, 100, 100),  # capped
])
def test_connection_share_is_twice_the_session_share(capacity, tokens, cap, share):
    settings = GatewaySettings(engine_capacity=capacity, tokens=tokens, max_connections_per_tenant=cap)
    assert connection_share(settings) == share


def test_tenant_connections_refuse_past_the_share_per_tenant():
    connections = TenantConnections(share=2)
    connections.acquire("alice")
    connections.acquire("alice")
    with pytest.raises(ApiError) as err:
        connections.acquire("alice")
    connections.acquire("bob")  # another tenant's share is its own
    assert err.value.code == "RESOURCE_EXHAUSTED"
    assert (connections.count("alice"), connections.count("bob")) == (2, 1)
    connections.release("alice")
    connections.acquire("alice")  # a freed place can be taken again
    for tenant in ("alice", "alice", "bob"):
        connections.release(tenant)
    assert (connections.count("alice"), connections.count("bob")) == (0, 0)


def test_engine_kv_gauges_keep_recent_replicas_only():
    from prometheus_client import CollectorRegistry

    from headstart.v1 import engine_pb2
    from services.gateway.engine_kv import STALE_S, EngineKVGauges

    registry = CollectorRegistry()
    gauges = EngineKVGauges(registry)
    gauges.record(engine_pb2.EngineSessionInfo(replica="r1", kv_used_bytes=300, kv_shared_bytes=100,
                                               kv_budget_bytes=1000, kv_free_bytes=700, kv_blocks_used=5,
                                               kv_blocks_shared=2, kv_blocks_total=64), now=0.0)
    gauges.record(engine_pb2.EngineSessionInfo(replica="r2", kv_used_bytes=50), now=10.0)  # no budget: no free
    gauges.publish(now=20.0)
    value = lambda r, k: registry.get_sample_value("headstart_engine_kv_bytes", {"replica": r, "kind": k})  # noqa: E731
    assert [value("r1", k) for k in ("used", "shared", "budget", "free")] == [300, 100, 1000, 700]
    assert (value("r2", "used"), value("r2", "budget"), value("r2", "free")) == (50, 0, None)
    blocks = lambda r, k: registry.get_sample_value("headstart_engine_kv_blocks", {"replica": r, "kind": k})  # noqa: E731
    assert [blocks("r1", k) for k in ("used", "shared", "total")] == [5, 2, 64]
    gauges.publish(now=STALE_S + 5.0)  # r1 answered too long ago: dropped
    assert value("r1", "used") is None and value("r2", "used") == 50
    assert blocks("r1", "used") is None and blocks("r2", "used") == 0


def test_engine_data_lag_on_metrics_per_replica_with_a_histogram():
    from prometheus_client import CollectorRegistry

    from headstart.v1 import engine_pb2
    from services.gateway.engine_kv import EngineKVGauges

    registry = CollectorRegistry()
    gauges = EngineKVGauges(registry)
    gauges.record(engine_pb2.EngineSessionInfo(
        replica="r1", data_lag_versions_max=3, data_lag_versions_sum=5, data_lag_seconds_max=2.5,
        data_sessions_behind=2, data_lag_bucket_bounds_s=[0.1, 1.0], data_lag_bucket_counts=[4, 9],
        data_lag_seconds_sum=6.0, data_lag_count=10), now=0.0)
    gauges.publish(now=1.0)
    get = registry.get_sample_value
    assert [get(f"headstart_engine_data_{n}", {"replica": "r1"}) for n in
            ("lag_versions_max", "lag_versions", "lag_seconds_max", "sessions_behind")] == [3, 5, 2.5, 2]
    bucket = lambda le: get("headstart_engine_data_lag_seconds_bucket", {"replica": "r1", "le": le})  # noqa: E731
    assert (bucket("0.1"), bucket("1.0"), bucket("+Inf")) == (4, 9, 10)
    assert get("headstart_engine_data_lag_seconds_sum", {"replica": "r1"}) == 6.0
    assert get("headstart_engine_data_lag_seconds_count", {"replica": "r1"}) == 10


def test_work_budget_counts_characters_per_tenant():
    now = [0.0]
    budget = TenantWorkBudget(rate=100, burst=1000, clock=lambda: now[0])
    budget.spend("alice", 900)
    with pytest.raises(ApiError) as err:
        budget.spend("alice", 200)
    budget.spend("bob", 900)  # another tenant's budget is its own
    now[0] = 2.0
    budget.spend("alice", 200)
    assert err.value.code == "RATE_LIMITED"
    assert (new_chars("How many", "How many singers"), new_chars("abc", "abd"), new_chars("abc", "ab")) == (8, 1, 0)


def test_tenant_slots_refuse_past_running_plus_waiting():
    async def main():
        slots = TenantSlots("Runs", running=1, waiting=1)
        release = asyncio.Event()
        results = []

        async def hold(tenant):
            try:
                async with slots.slot(tenant):
                    await release.wait()
                results.append((tenant, "ok"))
            except ApiError as exc:
                results.append((tenant, exc.code))

        tasks = [asyncio.create_task(hold("alice")) for _ in range(3)] + [asyncio.create_task(hold("bob"))]
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(*tasks)
        return sorted(results)

    assert asyncio.run(main()) == [("alice", "RESOURCE_EXHAUSTED"), ("alice", "ok"), ("alice", "ok"), ("bob", "ok")]


def test_run_read_only_bounds_values_cells_and_total(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(50)])
    conn.close()
    limits = RunLimits(rows=20, cell_bytes=64, total_bytes=500, value_bytes=10_000, timeout_s=5)
    with pytest.raises(ApiError) as err:
        run_read_only(path, "SELECT zeroblob(20000) FROM t", limits)
    assert err.value.code == "INVALID_ARGUMENT"
    out = run_read_only(path, "SELECT zeroblob(1000), printf('%.*c', 1000, 'é') FROM t", limits)
    assert out["truncated"] and len(out["rows"]) < 20
    assert all(len(c.encode()) <= 64 + 3 for row in out["rows"] for c in row)
    out = run_read_only(path, "SELECT x FROM t ORDER BY x", limits)
    assert out == {"columns": ["x"], "rows": [[i] for i in range(20)], "truncated": False}
    with pytest.raises(ApiError) as slow:
        run_read_only(path, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
                      RunLimits(20, 64, 500, 10_000, timeout_s=0.2))
    assert slow.value.code == "CANCELLED"


def test_grpc_wire_deserializers_never_raise():
    parse = _safe(headstart_pb2.TypeRequest.FromString, limit=100)
    good = headstart_pb2.TypeRequest(input=headstart_pb2.Input(seq=1, text="AB")).SerializeToString()
    assert checked(parse(good)).input.text == "AB"
    bad = parse(good.replace(b"AB", b"\xff\xfe"))
    big = parse(headstart_pb2.TypeRequest(input=headstart_pb2.Input(seq=1, text="x" * 200)).SerializeToString())
    assert isinstance(bad, Malformed) and isinstance(big, TooLarge)
    codes = []
    for stand_in in (bad, big):
        with pytest.raises(ApiError) as err:
            checked(stand_in)
        codes.append(err.value.code)
    assert codes == ["INVALID_ARGUMENT", "MESSAGE_TOO_LARGE"]


def test_schema_loader_deadline_and_single_flight():
    """A database that never answers holds one load thread and its callers, never another database's open."""
    import threading

    from services.engine.loader import DatabaseUnavailable, SchemaLoader

    release, calls = threading.Event(), []

    def load(spec: str):
        calls.append(spec)
        if spec == "stuck":
            release.wait(10)
        elif spec == "broken":
            raise RuntimeError("connection to postgresql://u:hunter22@h/db failed")

    async def main():
        loader = SchemaLoader(load, timeout_s=0.3, max_workers=2)
        stuck = [asyncio.create_task(loader.ensure("stuck", "slow_pg")) for _ in range(5)]
        await loader.ensure("fine", "fine")  # not held behind the stuck ones
        outcomes = await asyncio.gather(*stuck, return_exceptions=True)
        with pytest.raises(DatabaseUnavailable) as broken:
            await loader.ensure("broken", "broken_db")
        release.set()
        loader.shutdown()
        return outcomes, broken.value

    outcomes, broken = asyncio.run(main())
    assert all(isinstance(o, DatabaseUnavailable) and o.code == "UNAVAILABLE" for o in outcomes)
    assert calls.count("stuck") == 1 and "fine" in calls
    assert "hunter22" not in broken.message and "postgresql" not in broken.message


def test_engine_kv_refresh_survives_an_unreachable_engine():
    """A scrape while the engine is away keeps the last numbers (until stale) and does not fail."""
    import grpc
    from prometheus_client import CollectorRegistry

    from headstart.v1 import engine_pb2
    from services.gateway.engine_kv import EngineKVGauges

    class Stub:
        def __init__(self, answers):
            self.answers = list(answers)

        async def Describe(self, ref, metadata, timeout):  # noqa: N802
            answer = self.answers.pop(0) if self.answers else grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())
            if isinstance(answer, Exception):
                raise answer
            return answer

    registry = CollectorRegistry()
    gauges = EngineKVGauges(registry)
    up = engine_pb2.EngineSessionInfo(replica="r1", kv_used_bytes=7, kv_budget_bytes=10, kv_free_bytes=3)
    asyncio.run(gauges.refresh(Stub([up]), ()))
    asyncio.run(gauges.refresh(Stub([]), ()))  # every probe fails: the last answer stays
    assert registry.get_sample_value("headstart_engine_kv_bytes", {"replica": "r1", "kind": "free"}) == 3
