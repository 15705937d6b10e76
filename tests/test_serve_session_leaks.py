"""Integration (issue 29, item 3): a session is closed on every way a client can leave.

On the real stack, one tenant opens and drops 240 sessions, each kind of
leaving 30 times: a WebSocket aborted right after the 101 (a TCP reset,
before "ready"), one closed cleanly before "ready", one closed and one
aborted after "ready"; a gRPC `Type` stream cancelled right after `open`
(before "ready") and one cancelled after "ready"; a REST session opened and
never closed, and one closed with DELETE. Afterwards the gateway holds no
session and no connection (`/healthz`, the `headstart_gateway_sessions` and
`headstart_gateway_connections` gauges), no replica holds an attached
session, and the tenant opens its whole share again. On the old gateway the
leaving-before-ready kinds leaked (`send_json(ready)` raised outside the
try that closes the session), and the tenant was locked out after its share.

The REST sessions nobody closes are the idle reaper's (session_idle_s is
short on this gateway); everything else must be closed by its edge.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import struct
import threading
import time

import grpc
import httpx
import pytest

from headstart.v1 import engine_pb2, engine_pb2_grpc, headstart_pb2, headstart_pb2_grpc
from tests.serve_helpers import recv, ws_connect

pytestmark = pytest.mark.slow
ROUNDS = 30
ALICE = (("authorization", "Bearer tok-alice"),)


def _ws_abort_after_upgrade(stack) -> None:
    """The handshake, the 101, then a TCP reset (SO_LINGER 0): gone before "ready"."""
    host, port = stack.http_url.removeprefix("http://").split(":")
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall((f"GET /v1/sessions/ws?db=world_1&token=tok-alice HTTP/1.1\r\nHost: {host}\r\n"
                   f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            assert chunk, "the gateway closed before the 101"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head[:80]
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _ws_close_before_ready(stack) -> None:
    ws_connect(stack).close()


def _ws_close_after_ready(stack) -> None:
    ws = ws_connect(stack)
    assert recv(ws)["type"] == "ready"
    ws.close()


def _ws_abort_after_ready(stack) -> None:
    ws = ws_connect(stack)
    assert recv(ws)["type"] == "ready"
    ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.socket.close()


def _type_stream(stub, wait_ready: bool) -> None:
    """A Type stream that sends open and is cancelled before or after its "ready"."""
    done = threading.Event()

    def requests():
        yield headstart_pb2.TypeRequest(open=headstart_pb2.OpenStream(db="world_1"))
        done.wait(60)

    call = stub.Type(requests(), metadata=ALICE, timeout=60)
    try:
        if wait_ready:
            assert next(call).WhichOneof("kind") == "ready"
    finally:
        call.cancel()
        done.set()


def _gauge(http, name: str) -> float:
    text = http.get("/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def _attached_on_replicas(serve_engine) -> dict[str, int]:
    """Sessions attached on each replica (Describe routed by many ids reaches both)."""
    seen = {}
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        for i in range(16):
            info = stub.Describe(engine_pb2.EngineSessionRef(), metadata=serve_engine.metadata(f"leak-probe-{i}"),
                                 timeout=30)
            seen[info.replica] = info.num_attached
    return seen


def _wait_until(predicate, what: str, timeout_s: float = 60.0):
    end = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < end, f"{what} did not happen"
        time.sleep(0.1)  # polling the gateway's and the replicas' state
    return value


def test_hundreds_of_clients_leaving_every_way_leak_nothing(make_gateway, serve_engine):
    stack = make_gateway(session_idle_s=2.0)
    share = stack.gateway.service.quotas.session_share
    assert share >= 2, "the waits below keep a slot spare"
    with httpx.Client(base_url=stack.http_url, timeout=60) as http, \
            grpc.insecure_channel(stack.grpc_target) as channel:
        stub = headstart_pb2_grpc.HeadstartStub(channel)
        ways = [lambda: _ws_abort_after_upgrade(stack), lambda: _ws_close_before_ready(stack),
                lambda: _ws_close_after_ready(stack), lambda: _ws_abort_after_ready(stack),
                lambda: _type_stream(stub, False), lambda: _type_stream(stub, True),
                lambda: http.post("/v1/sessions", json={"db": "world_1"}, headers=dict(ALICE)).raise_for_status(),
                lambda: http.delete("/v1/sessions/" + http.post("/v1/sessions", json={"db": "world_1"},
                                                                 headers=dict(ALICE)).json()["session_id"],
                                    headers=dict(ALICE)).raise_for_status()]
        service = stack.gateway.service
        for round_ in range(ROUNDS):
            for way in ways:
                # A client gone before "ready" leaves its open in flight on the gateway; the next
                # one waits for it to end (its connection released) and for a session slot (the
                # REST sessions nobody closes hold theirs until the reaper takes them), so no
                # open is refused for the test's own speed. A leak never frees either.
                # NOTE: two slots, not one: a gRPC stream cancelled right after its open can
                # reach the gateway's handler only after this check (no connection counted
                # yet) and take a slot for a moment (CI saw the next open refused so)
                _wait_until(lambda: service.quotas.connections.total() == 0
                            and service.sessions.count("alice") < share - 1, f"a free slot in round {round_}")
                way()
        _wait_until(lambda: http.get("/healthz").json()["sessions"] == 0, "the gateway's sessions back to 0")
        _wait_until(lambda: http.get("/healthz").json()["connections"] == 0, "the connections back to 0")
        assert _gauge(http, "headstart_gateway_sessions") == 0
        assert _gauge(http, "headstart_gateway_connections") == 0
        replicas = _wait_until(lambda: (lambda seen: seen if not any(seen.values()) else None)(
            _attached_on_replicas(serve_engine)), "the replicas' attached sessions back to 0")
        assert len(replicas) == 2
        assert _gauge(http, 'headstart_gateway_sessions_reaped_total{reason="idle"}') == ROUNDS  # the REST ones
        # and the tenant opens its whole share at once again
        sockets = [ws_connect(stack) for _ in range(share)]
        try:
            assert [recv(ws)["type"] for ws in sockets] == ["ready"] * share
        finally:
            for ws in sockets:
                ws.close()
