"""Integration (issue 45): what the data API promises about acknowledged rows, on a real gateway
(HTTP, WebSocket, public gRPC) in front of a replica's data RPCs on a real gRPC server
(random:tiny, float64) and a real Redis of its own:

- a retried push with the same push id (REST, WebSocket, gRPC and both Python clients) gets the
  earlier ack and adds nothing; the same id with other rows is refused;
- a Redis restarted *without the tail of its file* (its counter behind what the replica saw)
  never makes a push fail with seqs the client did not send: the push is renumbered above the
  replica's newest seq and acknowledged, and ingested;
- a full store (Redis at its maxmemory, `noeviction`) answers a typed STORE_FULL: HTTP 503 and
  gRPC RESOURCE_EXHAUSTED; nothing acknowledged is lost, and pushes go on once there is room.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import time
from contextlib import contextmanager

import grpc
import httpx
import pytest
import redis
from websockets.sync.client import connect

from headstart.client import ApiError, AsyncHeadstartClient, HeadstartClient
from headstart.data.live_store import LiveStore
from headstart.redis_server import local_redis
from services.gateway.sessions import engine_session_id
from tests.redis_fixture import redis_binary_or_skip
from tests.test_engine_data import SECRET, Replica, db_root  # noqa: F401 (fixture)

TOKEN = "tok-alice"
AUTH = {"authorization": f"Bearer {TOKEN}"}
_ids = itertools.count(1000)


def readings(n: int) -> list[dict]:
    out = []
    for _ in range(n):
        i = next(_ids)
        out.append({"table": "readings", "values": {"id": i, "sensor": f"s{i % 3}", "value": 0.5 * i, "ts": f"t{i}"}})
    return out


@contextmanager
def gateway_on(replica: Replica, redis_url: str, root):
    from services.gateway.app import GatewayServer
    from services.gateway.settings import GatewaySettings

    settings = GatewaySettings(host="127.0.0.1", port=0, grpc_port=0, engine_target=f"127.0.0.1:{replica.port}",
                               engine_app="data-durability", engine_secret=SECRET, engine_direct=False,
                               tokens={TOKEN: "alice"}, sqlite_roots=[root], redis_url=redis_url,
                               reconnect_timeout_s=30)
    server = GatewayServer(settings).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def replica(tiny_runtime, db_root):  # noqa: F811
    rep = Replica(tiny_runtime, db_root)
    yield rep
    rep.stop()


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def wait_version(http: httpx.Client, sid: str, version: int, timeout_s: float = 60) -> dict:
    end = time.monotonic() + timeout_s
    while True:
        d = ok(http.get(f"/v1/data/{sid}", headers=AUTH))
        if d["data_version"] >= version and d["buffered"] == 0:
            return d
        assert time.monotonic() < end, d
        time.sleep(0.05)  # polling the replica's ingestion


def test_a_retried_push_id_gets_the_earlier_ack_on_every_edge(replica, db_root, redis_url):  # noqa: F811
    import json

    with gateway_on(replica, redis_url, db_root) as gw, httpx.Client(
            base_url=f"http://127.0.0.1:{gw.http_port}", timeout=60) as http:
        sid = ok(http.post("/v1/data", json={"db": "readings"}, headers=AUTH))["session_id"]
        rows = readings(3)
        first = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": rows, "push_id": "rest-1"}, headers=AUTH))
        again = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": rows, "push_id": "rest-1"}, headers=AUTH))
        assert (first["seqs"], first["replayed"]) == ([1, 2, 3], False)
        assert again == {**first, "replayed": True}  # the earlier ack, word for word
        r = http.post(f"/v1/data/{sid}/rows", json={"rows": readings(1), "push_id": "rest-1"}, headers=AUTH)
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_ARGUMENT") and "other rows" in r.text
        r = http.post(f"/v1/data/{sid}/rows", json={"rows": readings(1), "push_id": 5}, headers=AUTH)
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_ARGUMENT")
        no_id = readings(1)  # without an id a retry is a new push: at least once
        assert [ok(http.post(f"/v1/data/{sid}/rows", json={"rows": no_id}, headers=AUTH))["seqs"]
                for _ in range(2)] == [[4], [5]]

        ws_rows = readings(2)
        with connect(f"ws://127.0.0.1:{gw.http_port}/v1/sessions/ws?data=1&token={TOKEN}", open_timeout=30) as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "ready"
            acks = []
            for _ in range(2):
                ws.send(json.dumps({"type": "data_push", "session_id": sid, "rows": ws_rows, "push_id": "ws-1"}))
                acks.append(json.loads(ws.recv(timeout=60)))
        assert [(a["type"], a["seqs"], a["replayed"]) for a in acks] == [("data_ack", [6, 7], False),
                                                                         ("data_ack", [6, 7], True)]

        grpc_rows = readings(5)
        with HeadstartClient(f"127.0.0.1:{gw.grpc_port}", token=TOKEN) as client:
            pushed = client.push_rows(sid, grpc_rows, batch_rows=2, push_id="grpc-1")
            retried = client.push_rows(sid, grpc_rows, batch_rows=2, push_id="grpc-1")
            assert list(pushed.seqs) == list(retried.seqs) == [8, 9, 10, 11, 12]
            assert (pushed.replayed_pushes, retried.replayed_pushes) == (0, 3)  # 3 messages, each answered again
            # a retry of a call cut short after its first message: that one replayed, the rest pushed
            more = readings(4)
            client.push_rows(sid, more[:2], batch_rows=2, push_id="grpc-2")
            whole = client.push_rows(sid, more, batch_rows=2, push_id="grpc-2")
            assert (list(whole.seqs), whole.replayed_pushes) == ([13, 14, 15, 16], 1)

        async def async_twice() -> list:
            async with AsyncHeadstartClient(f"127.0.0.1:{gw.grpc_port}", token=TOKEN) as client:
                rows = readings(2)
                return [await client.push_rows(sid, rows, push_id="async-1") for _ in range(2)]

        first_async, second_async = asyncio.run(async_twice())
        assert list(first_async.seqs) == list(second_async.seqs) == [17, 18]
        assert (first_async.replayed_pushes, second_async.replayed_pushes) == (0, 1)

        d = wait_version(http, sid, 18)
        store = LiveStore(redis_url)
        try:
            logged = store.rows(engine_session_id("alice", sid))
        finally:
            store.close()
        assert [seq for seq, _ in logged] == list(range(1, 19))  # no push logged twice
        # but the push sent twice without an id is there twice: its second copy (a duplicate key) refused
        assert (d["rows_in_cache"], d["describe"]["refused"]) == (17, 1)
        ok(http.delete(f"/v1/data/{sid}", headers=AUTH))


def test_a_redis_back_without_its_tail_renumbers_the_push_above_the_replica(replica, db_root, tmp_path):  # noqa: F811
    """The store's seq counter goes back (its file lost its last writes) while the replica has seen
    seqs up to 9: the next push is acknowledged above 9, never refused with seqs the client did not send."""
    with local_redis(dir=tmp_path / "redis", binary=redis_binary_or_skip(), aof=True) as server, \
            gateway_on(replica, server.url, db_root) as gw, \
            httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=60) as http:
        sid = ok(http.post("/v1/data", json={"db": "readings"}, headers=AUTH))["session_id"]
        eid = engine_session_id("alice", sid)
        assert ok(http.post(f"/v1/data/{sid}/rows", json={"rows": readings(3)}, headers=AUTH))["seqs"] == [1, 2, 3]
        wait_version(http, sid, 3)
        server.stop()
        shutil.copytree(server.dir / "appendonlydir", tmp_path / "file-at-3")  # the file as it was at seq 3
        server.start()
        for _ in range(2):
            ok(http.post(f"/v1/data/{sid}/rows", json={"rows": readings(3)}, headers=AUTH))
        wait_version(http, sid, 9)
        server.kill()
        shutil.rmtree(server.dir / "appendonlydir")
        shutil.copytree(tmp_path / "file-at-3", server.dir / "appendonlydir")  # the tail is lost
        server.start()
        store = LiveStore(server.url)
        try:
            assert store.last_seq(eid) == 3  # the counter went back below what the replica saw
            rows = readings(2)
            ack = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": rows, "push_id": "after"}, headers=AUTH))
            assert ack["seqs"] == [10, 11] and not ack["replayed"]  # renumbered above the replica's 9
            assert store.last_seq(eid) == 11 and [s for s, _ in store.rows(eid)] == [1, 2, 3, 10, 11]
            assert ok(http.post(f"/v1/data/{sid}/rows", json={"rows": rows, "push_id": "after"},
                                headers=AUTH))["seqs"] == [10, 11]  # its id names the seqs it got
            assert ok(http.post(f"/v1/data/{sid}/rows", json={"rows": readings(1)}, headers=AUTH))["seqs"] == [12]
            assert wait_version(http, sid, 12)["data_version"] == 12
        finally:
            store.close()
        ok(http.delete(f"/v1/data/{sid}", headers=AUTH))


def _fill(url: str) -> redis.Redis:
    """Make Redis full: its maxmemory set to half what it uses (it evicts nothing, `noeviction`), so
    every write is refused however much the server's own buffers shrink meanwhile (filling it to
    the brim left it a few bytes over, and a later cron could bring it back under); the client
    (`_unfill` gives the room back)."""
    client = redis.Redis.from_url(url)
    client.was_maxmemory = client.config_get("maxmemory")["maxmemory"]
    client.set("filler", "x" * 65_536)
    client.config_set("maxmemory", client.info("memory")["used_memory"] // 2)
    with pytest.raises(redis.OutOfMemoryError):
        client.set("filler:probe", "x")
    return client


def _unfill(client: redis.Redis) -> None:
    client.config_set("maxmemory", client.was_maxmemory)
    client.delete("filler")
    client.close()


def test_a_full_store_answers_store_full_and_loses_nothing(replica, db_root, tmp_path):  # noqa: F811
    args = ["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"]  # the chart's policy, a tiny store
    with local_redis(dir=tmp_path / "redis", binary=redis_binary_or_skip(), extra_args=args) as server, \
            gateway_on(replica, server.url, db_root) as gw, \
            httpx.Client(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=60) as http:
        sid = ok(http.post("/v1/data", json={"db": "readings"}, headers=AUTH))["session_id"]
        eid = engine_session_id("alice", sid)
        acked = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": readings(3)}, headers=AUTH))["seqs"]
        filler = _fill(server.url)
        try:
            r = http.post(f"/v1/data/{sid}/rows", json={"rows": readings(2), "push_id": "full"}, headers=AUTH)
            assert (r.status_code, r.json().get("code")) == (503, "STORE_FULL"), r.text
            r = http.post("/v1/data", json={"db": "readings"}, headers=AUTH)
            assert (r.status_code, r.json().get("code")) == (503, "STORE_FULL"), r.text
            with HeadstartClient(f"127.0.0.1:{gw.grpc_port}", token=TOKEN) as client:
                with pytest.raises(ApiError) as refused:
                    client.push_rows(sid, readings(1))
                assert refused.value.code == "STORE_FULL"
                call = client.stub.PushRows.with_call
                with pytest.raises(grpc.RpcError) as status:
                    from headstart.client.data import push_requests

                    call(iter(push_requests(sid, readings(1), 8)), metadata=client.metadata, timeout=30)
                assert status.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            store = LiveStore(server.url)
            try:  # reads go on; the refused pushes took no seq and left no row
                assert store.last_seq(eid) == 3 and [s for s, _ in store.rows(eid)] == acked
            finally:
                store.close()
        finally:
            _unfill(filler)
        ack = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": readings(2), "push_id": "full"}, headers=AUTH))
        assert ack["seqs"] == [4, 5] and not ack["replayed"]  # the refused push id was never logged
        wait_version(http, sid, 5)
        ok(http.delete(f"/v1/data/{sid}", headers=AUTH))
