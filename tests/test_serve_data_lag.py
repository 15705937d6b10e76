"""Integration (issue 45): bounded ingestion lag on the real stack (real Redis, a real Ray Serve
replica of random:tiny in float64, a real gateway over REST, SSE and gRPC).

An engine app of its own bounds a data session at one acknowledged push behind
(`data_max_lag_versions=1`). A large push keeps the replica ingesting for many
forwards; a push sent meanwhile is refused whole with INGESTION_BEHIND and a
retry hint (REST 503 + Retry-After, gRPC UNAVAILABLE + the pushback trailer),
nothing of it is logged, every acknowledged row reaches the cache, and the
lag is reported in describe, in the `data_updated` events and on /metrics.
"""

from __future__ import annotations

import itertools
import re
import time

import httpx
import pytest

from headstart.client import ApiError, HeadstartClient
from headstart.data.live_store import LiveStore
from services.gateway.sessions import engine_session_id
from tests.serve_fixture import own_engine_app

pytestmark = pytest.mark.slow

APP = "headstart-engine-lag"
DB = "world_1"
ALICE = {"authorization": "Bearer tok-alice"}
BIG_PUSH = 160  # rows: many chunk-sized forwards on the replica, far longer than one HTTP round trip
ATTEMPTS = 5
_ids = itertools.count(60_000)  # city IDs no other test uses


def cities(n: int) -> list[dict]:
    return [{"table": "city", "values": {"ID": i, "Name": f"Lag {i}", "CountryCode": "NLD", "District": "Zuid",
                                         "Population": 1000 + i}} for i in (next(_ids) for _ in range(n))]


@pytest.fixture(scope="module")
def lag_gateway(serve_engine, tmp_path_factory):
    from headstart.config import EngineSettings

    settings = EngineSettings(model="random:tiny", dtype="float64", threads=1, chunk_tokens=64, debounce_ms=0.0,
                              p0_cache_dir=tmp_path_factory.mktemp("lag-p0"), redis_url=serve_engine.redis_url,
                              data_max_lag_versions=1, data_max_lag_s=0.0)
    # a large push in one message: the body limit raised for it
    with own_engine_app(serve_engine, APP, settings, redis_url=serve_engine.redis_url,
                        max_message_bytes=1 << 20) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def http(lag_gateway):
    with httpx.Client(base_url=f"http://127.0.0.1:{lag_gateway.http_port}", timeout=120) as client:
        yield client


def _open(http) -> str:
    r = http.post("/v1/data", json={"db": DB, "retention_tokens": 1 << 16}, headers=ALICE)
    assert r.status_code == 200, r.text
    return r.json()["session_id"]


def _caught_up(http, sid: str, timeout_s: float = 120) -> dict:
    end = time.monotonic() + timeout_s
    while True:
        d = http.get(f"/v1/data/{sid}", headers=ALICE).json()
        if d["lag"]["versions"] == 0 and d["buffered"] == 0:
            return d
        assert time.monotonic() < end, d
        time.sleep(0.05)  # polling a remote replica's ingestion


def _refused_behind(push_big, push_small, settle):
    """Push a large batch then at once a small one, until the small one is refused (at most ATTEMPTS
    times: the large one must still be ingesting when the small one arrives). Returns the refusal
    and the rows acknowledged."""
    acked = 0
    for _ in range(ATTEMPTS):
        acked += push_big()
        refusal = push_small()
        if refusal is not None:
            return refusal, acked
        acked += 1
        settle()
    pytest.fail(f"no push was refused in {ATTEMPTS} attempts: the replica was never behind")


def test_rest_push_behind_gets_503_with_retry_after_and_nothing_acked_is_lost(http, lag_gateway, serve_engine):
    sid = _open(http)

    def big():
        r = http.post(f"/v1/data/{sid}/rows", json={"rows": cities(BIG_PUSH)}, headers=ALICE)
        assert r.status_code == 200, r.text
        return len(r.json()["seqs"])

    def small():
        r = http.post(f"/v1/data/{sid}/rows", json={"rows": cities(1)}, headers=ALICE)
        if r.status_code == 200:
            return None
        return r

    refusal, acked = _refused_behind(big, small, lambda: _caught_up(http, sid))
    assert refusal.status_code == 503, refusal.text
    body = refusal.json()
    assert body["code"] == "INGESTION_BEHIND" and "1 pushes behind" in body["message"]
    assert int(refusal.headers["Retry-After"]) >= 1 and 0.1 <= body["retry_after_s"] <= 30
    d = _caught_up(http, sid)
    # every acknowledged row is in the cache and the log; the refused push left nothing behind
    assert d["rows_in_cache"] == acked and d["lag"] == {"versions": 0, "rows": 0, "seconds": 0.0}
    assert d["describe"]["behind_refusals"] >= 1
    store = LiveStore(serve_engine.redis_url)
    try:
        eid = engine_session_id("alice", sid)
        assert len(store.rows(eid)) == acked
        # the versions published while a big push was still going in said so; the last one caught up
        updates = [e.payload for e in store.events_after(eid, None, count=10_000) if e.kind == "data_updated"]
    finally:
        store.close()
    assert any(u["lag_versions"] >= 1 and u["lag_seconds"] > 0 for u in updates), updates
    assert updates[-1]["lag_versions"] == 0 and updates[-1]["version"] == d["data_version"]
    metrics = http.get("/metrics").text
    assert re.search(r'^headstart_gateway_errors_total\{code="INGESTION_BEHIND",edge="rest"\} [1-9]', metrics, re.M)
    count = re.search(r'^headstart_engine_data_lag_seconds_count\{replica="[^"]+"\} ([0-9.e+]+)$', metrics, re.M)
    assert count and float(count.group(1)) >= 1, metrics[-2000:]  # the big push, at least
    assert re.search(r'^headstart_engine_data_lag_seconds_max\{replica="[^"]+"\} ', metrics, re.M)
    assert http.delete(f"/v1/data/{sid}", headers=ALICE).status_code == 200


def test_grpc_push_behind_gets_unavailable_with_pushback(http, lag_gateway):
    sid = _open(http)
    with HeadstartClient(f"127.0.0.1:{lag_gateway.grpc_port}", token="tok-alice") as client:
        def big():
            return len(client.push_rows(sid, cities(BIG_PUSH), batch_rows=BIG_PUSH).seqs)

        def small():
            try:
                client.push_rows(sid, cities(1))
            except ApiError as exc:
                return exc
            return None

        refusal, acked = _refused_behind(big, small, lambda: _caught_up(http, sid))
        assert refusal.code == "INGESTION_BEHIND" and 0.1 <= refusal.retry_after_s <= 30
        d = _caught_up(http, sid)
        assert d["rows_in_cache"] == acked
        client.close_data(sid)
