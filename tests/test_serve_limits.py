"""Integration: authentication, tenant isolation, admission control and edge
limits, each answered with a typed error code, never a hang."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from headstart.client import ApiError, HeadstartClient
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.gateway.sessions import engine_session_id
from tests.serve_fixture import MAX_ATTACHED, NUM_REPLICAS
from tests.serve_helpers import recv, recv_until, ws_connect

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("token, code", [(None, "UNAUTHENTICATED"), ("nope", "UNAUTHENTICATED")])
def test_grpc_rejects_bad_tokens(serve_stack, token, code):
    with HeadstartClient(serve_stack.grpc_target, token=token) as client:
        with pytest.raises(ApiError) as err:
            client.list_databases()
    assert err.value.code == code


@pytest.mark.parametrize("token, status", [(None, 401), ("nope", 401), ("tok-bob", 200)])
def test_rest_auth(serve_stack, token, status):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    assert httpx.get(f"{serve_stack.http_url}/v1/databases", headers=headers).status_code == status


@pytest.mark.parametrize("token, db, code, close_code", [
    (None, "world_1", "UNAUTHENTICATED", 4401),
    ("tok-alice", "no_such_db", "NOT_FOUND", 4404),
])
def test_ws_open_errors(serve_stack, token, db, code, close_code):
    with ws_connect(serve_stack, db=db, token=token) as ws:
        message = recv(ws)
        with pytest.raises(Exception):
            recv(ws, 5)
    assert (message["type"], message["code"]) == ("error", code)
    assert ws.close_code == close_code


def test_tenant_isolation(serve_stack):
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as alice, \
            HeadstartClient(serve_stack.grpc_target, token="tok-bob") as bob:
        sid = alice.open_session("world_1")
        try:
            with pytest.raises(ApiError) as attach:
                bob.typing(session_id=sid)
            with pytest.raises(ApiError) as close:
                bob.close_session(sid)
            with ws_connect(serve_stack, token="tok-bob", session=sid) as ws:
                ws_error = recv(ws)
            with alice.typing(session_id=sid) as session:  # the owner still can
                session.input("How many countries")
                assert session.wait_caught_up().seq == 1
        finally:
            alice.close_session(sid)
    assert (attach.value.code, close.value.code, ws_error["code"]) == ("NOT_FOUND", "NOT_FOUND", "NOT_FOUND")


def _attached_per_replica(serve_engine) -> dict[str, int]:
    import grpc

    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        infos = [stub.Describe(engine_pb2.EngineSessionRef(),
                               metadata=serve_engine.metadata(f"probe-{i}"))
                 for i in range(16)]
    return {i.replica: i.num_attached for i in infos}


def test_admission_control_max_sessions(serve_stack, serve_engine):
    """Each replica takes MAX_ATTACHED sessions; past it RESOURCE_EXHAUSTED,
    and capacity comes back when sessions close."""
    opened, errors = [], []
    with HeadstartClient(serve_stack.grpc_target, token="tok-bob", timeout_s=30) as client:
        try:
            for _ in range(MAX_ATTACHED * NUM_REPLICAS + 6):
                try:
                    opened.append(client.open_session("world_1"))
                except ApiError as exc:
                    errors.append(exc.code)
        finally:
            for sid in opened:
                client.close_session(sid)
        again = client.open_session("world_1")
        client.close_session(again)
    end = time.monotonic() + 10
    while any((attached := _attached_per_replica(serve_engine)).values()) and time.monotonic() < end:
        time.sleep(0.1)
    assert list(attached.values()) == [0] * NUM_REPLICAS  # closing gave every slot back
    assert MAX_ATTACHED <= len(opened) <= MAX_ATTACHED * NUM_REPLICAS
    assert errors and set(errors) == {"RESOURCE_EXHAUSTED"}
    assert len(opened) + len(errors) == MAX_ATTACHED * NUM_REPLICAS + 6


LONG = "x" * 5000
BIG = json.dumps({"type": "input", "seq": 1, "text": "y" * 20000})


@pytest.mark.parametrize("raw, code", [
    ("not json", "INVALID_ARGUMENT"),
    ("[1, 2]", "INVALID_ARGUMENT"),
    ('{"type": "fly"}', "INVALID_ARGUMENT"),
    ('{"seq": 1}', "INVALID_ARGUMENT"),
    ('{"type": "input", "seq": "1", "text": "a"}', "INVALID_ARGUMENT"),
    ('{"type": "input", "seq": -3, "text": "a"}', "INVALID_ARGUMENT"),
    ('{"type": "input", "seq": 1, "text": 5}', "INVALID_ARGUMENT"),
    ('{"type": "submit", "seq": 1, "text": "a", "max_new_tokens": 100000}', "INVALID_ARGUMENT"),
    ('{"type": "input", "seq": 1, "text": "\\ud800"}', "INVALID_ARGUMENT"),
    (json.dumps({"type": "input", "seq": 1, "text": LONG}), "TEXT_TOO_LONG"),
    (BIG, "MESSAGE_TOO_LARGE"),
])
def test_ws_malformed_messages(serve_stack, raw, code):
    with ws_connect(serve_stack) as ws:
        assert recv(ws)["type"] == "ready"
        ws.send(raw)
        error, _ = recv_until(ws, {"error"})
        ws.send(json.dumps({"type": "input", "seq": 7, "text": "How many"}))  # still usable
        progress, _ = recv_until(ws, {"progress"})
        while progress["seq"] != 7:
            progress, _ = recv_until(ws, {"progress"})
    assert error["code"] == code


def test_ws_rate_limit(make_gateway):
    stack = make_gateway(rate_per_s=0.5, rate_burst=3)
    with ws_connect(stack) as ws:
        assert recv(ws)["type"] == "ready"
        for seq in range(1, 7):
            ws.send(json.dumps({"type": "input", "seq": seq, "text": "How" + "!" * seq}))
        codes = []
        end = time.monotonic() + 10
        while len(codes) < 3 and time.monotonic() < end:
            message = recv(ws)
            if message["type"] == "error":
                codes.append(message["code"])
    assert codes == ["RATE_LIMITED"] * 3


@pytest.mark.parametrize("text, code", [("z" * 5000, "TEXT_TOO_LONG"), ("q" * 20000, "MESSAGE_TOO_LARGE")])
def test_grpc_oversized_input(serve_stack, text, code):
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        with pytest.raises(ApiError) as err:
            client.complete("world_1", text, 4)
    assert err.value.code == code


def test_newer_snapshot_cancels_submit(serve_stack):
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        with client.typing("world_1") as session:
            session.input("How many countries")
            assert session.send_submit("How many countries", 400) == 2
            session.input("How many countries are there")
            while not session.errors:
                session.next_event(30)
    assert [(e.code, e.seq) for e in session.errors] == [("CANCELLED", 2)]


def test_disconnect_frees_the_replica(serve_stack, serve_engine):
    import grpc

    with ws_connect(serve_stack) as ws:
        sid = recv(ws)["session"]
        ws.send(json.dumps({"type": "input", "seq": 1, "text": "How many"}))
        recv_until(ws, {"progress"})
    engine_sid = engine_session_id("alice", sid)
    md = serve_engine.metadata(engine_sid)
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        end = time.monotonic() + 10
        while (info := stub.Describe(engine_pb2.EngineSessionRef(session_id=engine_sid), metadata=md)).holds_session:
            assert time.monotonic() < end, "the replica still holds a closed session"
            time.sleep(0.1)
    assert not info.holds_session
