"""Integration (issue 29, item 5): the data API survives its Redis restarting.

An engine app of its own on the session's Ray Serve (one replica,
random:tiny float64) and a gateway of its own, both on a private Redis with
the append-only file the data API promises (`appendfsync always`, as
`headstart serve`'s embedded Redis and the chart's). The promise: a Redis
that crashes (SIGKILL) and restarts loses no acknowledged row of a live
session; while it is down, pushes and `POST /v1/data` are a typed 503
UNAVAILABLE (it was a 500 ConnectionError), and an SSE stream ends with a
retryable `error` event (it just stopped) from which the client resumes by
its last event id once Redis is back. A Redis that comes back *without* a
session (its data lost) makes the replica drop that session's cache
(it used to stay, counted against the replica's data-session share, with
nothing to free it).
"""

from __future__ import annotations

import json
import shutil
import time

import grpc
import httpx
import pytest

from headstart.data.live_store import LiveStore
from headstart.redis_server import RedisServerError, find_redis_binary, local_redis
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.guard import TENANT_METADATA_KEY
from services.gateway.data_events import parse_event_id
from services.gateway.sessions import engine_session_id
from tests.serve_fixture import own_engine_app
from tests.test_gateway_data import ALICE, QUESTION, cities, ok

pytestmark = pytest.mark.slow
APP = "headstart-engine-redis"


@pytest.fixture(scope="module")
def aof_redis(tmp_path_factory):
    try:
        binary = find_redis_binary()
    except RedisServerError as exc:
        pytest.skip(f"no Redis server binary: {exc}")
    with local_redis(dir=tmp_path_factory.mktemp("aof-redis"), binary=binary, aof=True) as server:
        yield server


@pytest.fixture(scope="module")
def stack(serve_engine, aof_redis, tmp_path_factory):
    """The HTTP URL of a gateway and an engine app of their own on `aof_redis`."""
    from headstart.config import EngineSettings

    settings = EngineSettings(model="random:tiny", dtype="float64", threads=1, chunk_tokens=64, debounce_ms=0.0,
                              p0_cache_dir=tmp_path_factory.mktemp("p0-redis"), redis_url=aof_redis.url)
    with own_engine_app(serve_engine, APP, settings, redis_url=aof_redis.url, reconnect_timeout_s=90) as gateway:
        yield f"http://127.0.0.1:{gateway.http_port}"


def _wait(predicate, what: str, timeout_s: float = 60.0):
    end = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < end, f"{what} did not happen"
        time.sleep(0.1)  # polling a remote replica's (or Redis's) state
    return value


def _ingested(http, sid: str, version: int):
    d = http.get(f"/v1/data/{sid}", headers=ALICE)
    return d.status_code == 200 and d.json()["data_version"] >= version and d.json()["buffered"] == 0 and d.json()


def _sse_lines(http, sid: str, last_id: str | None, stop) -> list[str]:
    """The SSE stream's lines until `stop(lines)` or its end."""
    headers = {**ALICE, **({"Last-Event-ID": last_id} if last_id else {})}
    lines = []
    with http.stream("GET", f"/v1/data/{sid}/events", headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            lines.append(line)
            if stop(lines):
                break
    return lines


def _events(lines: list[str]) -> list[tuple[str | None, str, dict]]:
    """(id, kind, payload) of each complete event (ended by its blank line) in SSE lines."""
    out, current = [], {}
    for line in lines:
        if not line:
            if "event" in current:
                out.append((current.get("id"), current["event"], json.loads(current["data"])))
            current = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            current[key] = value
    return out


def _replica_data_sessions(serve_engine) -> int:
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        info = engine_pb2_grpc.EngineStub(channel).Describe(
            engine_pb2.EngineSessionRef(), metadata=(("application", APP), *serve_engine.metadata()[1:]), timeout=30)
    return info.num_data_sessions


def test_a_redis_crash_loses_no_acknowledged_row_and_every_error_is_typed(stack, aof_redis, serve_engine):
    with httpx.Client(base_url=stack, timeout=120) as http:
        sid = ok(http.post("/v1/data", json={"db": "world_1"}, headers=ALICE))["session_id"]
        eid = engine_session_id("alice", sid)
        acked = []
        for _ in range(3):
            acked += ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(3)}, headers=ALICE))["seqs"]
        _wait(lambda: _ingested(http, sid, acked[-1]), "ingestion")
        seen = _events(_sse_lines(http, sid, "0", lambda lines: any(
            p["version"] == acked[-1] for _, kind, p in _events(lines) if kind == "data_updated")))
        last_id = seen[-1][0]

        aof_redis.kill()  # a crash: no shutdown, no final fsync
        r = http.post("/v1/data", json={"db": "world_1"}, headers=ALICE)
        assert (r.status_code, r.json()["code"]) == (503, "UNAVAILABLE"), r.text
        r = http.post(f"/v1/data/{sid}/rows", json={"rows": cities(1)}, headers=ALICE)
        assert (r.status_code, r.json()["code"]) == (503, "UNAVAILABLE"), r.text
        # a stream that was open when Redis went away would end the same way; one opened now is refused
        assert http.get(f"/v1/data/{sid}/events", headers=ALICE).json()["code"] == "UNAVAILABLE"

        aof_redis.start()  # on its port, from its append-only file
        store = LiveStore(aof_redis.url)
        try:
            assert [seq for seq, _ in store.rows(eid)] == acked  # every acknowledged row, in order
        finally:
            store.close()
        d = ok(http.get(f"/v1/data/{sid}", headers=ALICE))
        assert (d["state"], d["data_version"]) == ("live", acked[-1])
        more = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(2)}, headers=ALICE))["seqs"]
        assert more[0] == acked[-1] + 1  # the seq counter survived too: no seq is handed out twice
        _wait(lambda: _ingested(http, sid, more[-1]), "ingestion after the restart")
        # the client resumes by its last event id: the events after it, none before
        resumed = _events(_sse_lines(http, sid, last_id, lambda lines: any(
            p["version"] == more[-1] for _, kind, p in _events(lines) if kind == "data_updated")))
        assert [p["version"] for _, kind, p in resumed if kind == "data_updated"][-1] == more[-1]
        assert all(parse_event_id(event_id) > parse_event_id(last_id) for event_id, _, _ in resumed)
        # a replica that lost the session rebuilds it from the log: every acknowledged row is in it
        with grpc.insecure_channel(serve_engine.grpc_target) as channel:
            engine_pb2_grpc.EngineStub(channel).DataClose(engine_pb2.DataRef(session_id=eid), metadata=(
                ("application", APP), *serve_engine.metadata(eid)[1:], (TENANT_METADATA_KEY, "alice")))
        d = _wait(lambda: _ingested(http, sid, more[-1]), "the rebuild")
        assert (d["rows_in_cache"], d["describe"]["restored"]) == (len(acked) + len(more), len(acked) + len(more))
        assert ok(http.post(f"/v1/data/{sid}/query", json={"question": QUESTION, "max_new_tokens": 4},
                            headers=ALICE))["version"] == more[-1]
        ok(http.delete(f"/v1/data/{sid}", headers=ALICE))


def test_an_open_event_stream_ends_with_a_retryable_error_when_redis_goes(stack, aof_redis):
    with httpx.Client(base_url=stack, timeout=120) as http:
        sid = ok(http.post("/v1/data", json={"db": "world_1"}, headers=ALICE))["session_id"]
        try:
            lines = []
            with http.stream("GET", f"/v1/data/{sid}/events", headers=ALICE, timeout=60) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    if line == ": subscribed":
                        aof_redis.kill()  # while the subscriber waits on Redis
            ((event_id, kind, payload),) = _events(lines)
            assert (event_id, kind, payload["code"], payload["retryable"]) == (None, "error", "UNAVAILABLE", True)
            assert "retry: 1000" in lines
        finally:
            if not aof_redis.is_running:
                aof_redis.start()
            http.delete(f"/v1/data/{sid}", headers=ALICE)


def test_a_redis_that_comes_back_without_a_session_frees_its_cache(stack, aof_redis, serve_engine):
    with httpx.Client(base_url=stack, timeout=120) as http:
        sid = ok(http.post("/v1/data", json={"db": "world_1"}, headers=ALICE))["session_id"]
        seqs = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(3)}, headers=ALICE))["seqs"]
        _wait(lambda: _ingested(http, sid, seqs[-1]), "ingestion")
        assert _replica_data_sessions(serve_engine) >= 1
        aof_redis.stop()
        shutil.rmtree(aof_redis.dir / "appendonlydir")  # it comes back empty: its data is lost
        aof_redis.start()
        _wait(lambda: _replica_data_sessions(serve_engine) == 0, "the replica dropping the lost session's cache")
        r = http.get(f"/v1/data/{sid}", headers=ALICE)
        assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND")
        sid = ok(http.post("/v1/data", json={"db": "world_1"}, headers=ALICE))["session_id"]  # and it goes on
        assert _replica_data_sessions(serve_engine) == 1
        ok(http.delete(f"/v1/data/{sid}", headers=ALICE))
