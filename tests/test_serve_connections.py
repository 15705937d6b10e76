"""Integration (issue 16): a tenant's connections (WebSocket + gRPC Type streams)
are counted against its share at the gateway, on the real stack with two tenants.

Alice holds her whole share with Type streams that never send `open` (each
would otherwise be held until `type_open_timeout_s`); her next Type stream
and her next WebSocket are refused RESOURCE_EXHAUSTED at once, while Bob
opens both; once Alice's streams end she can connect again."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from headstart.client.errors import CODE_METADATA_KEY
from headstart.v1 import headstart_pb2, headstart_pb2_grpc
from tests.serve_helpers import recv, ws_connect

pytestmark = pytest.mark.slow

SHARE = 3
ALICE = (("authorization", "Bearer tok-alice"),)
BOB = (("authorization", "Bearer tok-bob"),)


def _wait_for(predicate, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def _open_and_ready(stub, metadata):
    """A Type stream that opens world_1; returns its first response (ready) and the call."""
    done = threading.Event()

    def requests():
        yield headstart_pb2.TypeRequest(open=headstart_pb2.OpenStream(db="world_1"))
        done.wait(60)

    call = stub.Type(requests(), metadata=metadata, timeout=60)
    return next(call), call, done


def test_connection_share_per_tenant(make_gateway):
    stack = make_gateway(max_connections_per_tenant=SHARE, type_open_timeout_s=120)
    connections = stack.gateway.service.quotas.connections
    assert connections.share == SHARE
    release = threading.Event()

    def silent():  # a Type stream that never sends open
        release.wait(120)
        return
        yield

    with grpc.insecure_channel(stack.grpc_target) as channel:
        stub = headstart_pb2_grpc.HeadstartStub(channel)
        idle = [stub.Type(silent(), metadata=ALICE, timeout=120) for _ in range(SHARE)]
        _wait_for(lambda: connections.count("alice") == SHARE)

        with pytest.raises(grpc.RpcError) as refused:
            _open_and_ready(stub, ALICE)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(refused.value.trailing_metadata())[CODE_METADATA_KEY] == "RESOURCE_EXHAUSTED"
        with ws_connect(stack, token="tok-alice") as ws:
            error = recv(ws)
            with pytest.raises(Exception):
                ws.recv(timeout=10)  # closed
        assert (error["type"], error["code"]) == ("error", "RESOURCE_EXHAUSTED")
        assert ws.close_code == 4429

        # Bob still gets his own share, on both edges.
        ready, bob_call, bob_done = _open_and_ready(stub, BOB)
        assert ready.WhichOneof("kind") == "ready" and ready.ready.db == "world_1"
        with ws_connect(stack, token="tok-bob") as ws:
            assert recv(ws)["type"] == "ready"
            assert connections.count("bob") == 2
        bob_done.set()
        bob_call.cancel()

        # Alice's streams end: her places are free again.
        for call in idle:
            call.cancel()
        release.set()
        _wait_for(lambda: connections.count("alice") == 0)
        with ws_connect(stack, token="tok-alice") as ws:
            assert recv(ws)["type"] == "ready"
    _wait_for(lambda: connections.count("alice") == connections.count("bob") == 0)
