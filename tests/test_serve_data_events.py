"""Integration (issue 29, items 4 and 6): event subscribers on the real stack.

Isolation: 120 idle SSE subscribers of one tenant (within its share) wait on
Redis on connections of that tenant's own pool (`hs-events:alice` in Redis's
CLIENT LIST), none on the pool every other data call uses (`hs-gateway`),
and the other tenant's data calls all succeed meanwhile. The old gateway
read them on 64 threads holding connections of that one shared pool, and
another tenant's push went from 28 ms to 2.1 s.

Resume ids outside what a session's stream kept are typed errors: an id
newer than any event given (it used to subscribe and never receive), an id
whose successors were trimmed away (a silent gap), and an id that is not one
(above 2^64: it used to end the stream after 0.4 s with no error, and a
browser reconnects forever). SSE answers the first two with an `error`
event naming the oldest id kept, the last with a 400; gRPC `Subscribe` with
OUT_OF_RANGE / INVALID_ARGUMENT (it ended OK with no events).
"""

from __future__ import annotations

import json
import socket
import time

import grpc
import httpx
import pytest
import redis

from headstart.client.errors import CODE_METADATA_KEY
from headstart.v1 import headstart_pb2, headstart_pb2_grpc
from services.gateway.data_events import parse_event_id
from services.gateway.sessions import engine_session_id
from tests.test_gateway_data import ALICE, BOB, QUESTION, cities, http, ok, open_data, store  # noqa: F401
from tests.test_serve_redis_restart import _events

pytestmark = pytest.mark.slow
SUBSCRIBERS = 120


def _subscribe_raw(url: str, sid: str) -> socket.socket:
    """An SSE subscriber that reads nothing after its first byte (an idle browser tab)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(f"GET /v1/data/{sid}/events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer tok-alice\r\n\r\n".encode())
    head = b""
    while b": subscribed" not in head:
        chunk = s.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    return s


def _blocked_readers(redis_url: str) -> dict[str, int]:
    """Connections blocked in XREAD right now, by client name."""
    client = redis.Redis.from_url(redis_url)
    try:
        out: dict[str, int] = {}
        for c in client.client_list():
            if c.get("cmd") == "xread" and "b" in c.get("flags", ""):
                out[c.get("name") or "(unnamed)"] = out.get(c.get("name") or "(unnamed)", 0) + 1
        return out
    finally:
        client.close()


def test_idle_subscribers_of_one_tenant_hold_only_their_own_pool(make_gateway, serve_engine):
    stack = make_gateway(engine_capacity=2 * 120)  # alice's connection share: 240, so 120 are within it
    assert stack.gateway.service.quotas.connections.share >= SUBSCRIBERS
    with httpx.Client(base_url=stack.http_url, timeout=120) as http:  # noqa: F811
        sid = open_data(http)
        sockets = [_subscribe_raw(stack.http_url, sid) for _ in range(SUBSCRIBERS)]
        try:
            # the subscribers wait on Redis: every blocked read is on alice's own pool
            blocked = {}
            end = time.monotonic() + 30
            while sum(blocked.values()) < SUBSCRIBERS // 2:
                assert time.monotonic() < end, blocked
                blocked = _blocked_readers(serve_engine.redis_url)
            assert set(blocked) == {"hs-events:alice"}, blocked
            # bob's data API works meanwhile, every call of it (the pool they need is free)
            bob_sid = open_data(http, BOB)
            seqs = ok(http.post(f"/v1/data/{bob_sid}/rows", json={"rows": cities(2)}, headers=BOB))["seqs"]
            ok(http.get(f"/v1/data/{bob_sid}", headers=BOB))
            ok(http.post(f"/v1/data/{bob_sid}/flash", json={"question": QUESTION}, headers=BOB))
            with http.stream("GET", f"/v1/data/{bob_sid}/events?last_event_id=0", headers=BOB) as r:
                assert r.status_code == 200
            assert len(seqs) == 2
            ok(http.delete(f"/v1/data/{bob_sid}", headers=BOB))
            assert "hs-gateway" not in _blocked_readers(serve_engine.redis_url)
        finally:
            for s in sockets:
                s.close()
            ok(http.delete(f"/v1/data/{sid}", headers=ALICE))
        end = time.monotonic() + 30
        while stack.gateway.service.quotas.connections.total():
            assert time.monotonic() < end, "the subscribers' connections were not released"
            time.sleep(0.1)


def _sse(http, sid: str, last_id: str) -> httpx.Response:  # noqa: F811
    return http.get(f"/v1/data/{sid}/events", headers={**ALICE, "Last-Event-ID": last_id}, timeout=30)


def _grpc_subscribe_error(stack, sid: str, last_id: str) -> tuple[grpc.StatusCode, str, str]:
    with grpc.insecure_channel(stack.grpc_target) as channel:
        stub = headstart_pb2_grpc.HeadstartStub(channel)
        call = stub.Subscribe(headstart_pb2.SubscribeRequest(session_id=sid, last_event_id=last_id),
                              metadata=(("authorization", "Bearer tok-alice"),), timeout=30)
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    exc = info.value
    return exc.code(), dict(exc.trailing_metadata())[CODE_METADATA_KEY], exc.details()


def test_resume_ids_outside_the_kept_range_are_typed_errors(http, store, serve_stack):  # noqa: F811
    sid = open_data(http)
    eid = engine_session_id("alice", sid)
    try:
        ids = [store.add_event(eid, "rows_dropped", {"dropped": 0, "dropped_seqs": [], "dropped_total": i})
               for i in range(1500)]  # past the ~1000 a session keeps: the oldest are trimmed
        oldest = store.events_after(eid, "0", count=1)[0].id
        assert parse_event_id(oldest) > parse_event_id(ids[0])
        newest = ids[-1]

        # newer than any event the stream gave
        r = _sse(http, sid, "9999999999999-0")
        assert r.status_code == 200
        ((event_id, kind, body),) = _events(r.text.split("\n"))
        assert (event_id, kind, body["code"], body["oldest_id"], body["newest_id"]) == (
            None, "error", "OUT_OF_RANGE", oldest, newest)
        assert body["retryable"] is False
        # one whose successors were trimmed away (a gap): the oldest id kept is named
        ((_, kind, body),) = _events(_sse(http, sid, ids[0]).text.split("\n"))
        assert (kind, body["code"], body["oldest_id"]) == ("error", "OUT_OF_RANGE", oldest)
        # not an id at all: a part above 2^64 - 1
        r = _sse(http, sid, f"{1 << 64}-0")
        assert (r.status_code, r.json()["code"]) == (400, "INVALID_ARGUMENT")
        # in range: from the oldest kept (the events after it), from 0 (every one kept)
        with http.stream("GET", f"/v1/data/{sid}/events", headers={**ALICE, "Last-Event-ID": oldest}) as r:
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if len(_events(lines)) == 2:
                    break
        assert [parse_event_id(e[0]) > parse_event_id(oldest) for e in _events(lines)] == [True, True]

        assert _grpc_subscribe_error(serve_stack, sid, "9999999999999-0")[:2] == (
            grpc.StatusCode.OUT_OF_RANGE, "OUT_OF_RANGE")
        code, exact, details = _grpc_subscribe_error(serve_stack, sid, ids[0])
        assert (code, exact) == (grpc.StatusCode.OUT_OF_RANGE, "OUT_OF_RANGE") and oldest in details
        assert _grpc_subscribe_error(serve_stack, sid, f"{1 << 64}-0")[:2] == (
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    finally:
        ok(http.delete(f"/v1/data/{sid}", headers=ALICE))


def test_a_resume_id_on_a_session_without_events_is_out_of_range(http, serve_stack):  # noqa: F811
    sid = open_data(http)
    try:
        ((_, kind, body),) = _events(_sse(http, sid, "5-0").text.split("\n"))
        assert (kind, body["code"], body["oldest_id"]) == ("error", "OUT_OF_RANGE", "0-0")
        with http.stream("GET", f"/v1/data/{sid}/events", headers={**ALICE, "Last-Event-ID": "0"}) as r:
            assert r.status_code == 200 and next(r.iter_lines()) == ": subscribed"
    finally:
        ok(http.delete(f"/v1/data/{sid}", headers=ALICE))
    assert json.loads(http.get(f"/v1/data/{sid}/events", headers=ALICE).text)["code"] == "NOT_FOUND"
