"""Integration: session streams go to the replica's own port (Locate through Serve's
proxy, then `Session` direct), on the real stack (2 Ray Serve replicas, random:tiny
float64); the same tokens as through the proxy; the port wants the engine secret;
a dead address falls back to the proxy."""

from __future__ import annotations

import grpc
import pytest

from headstart.client import HeadstartClient
from headstart.v1 import engine_pb2, engine_pb2_grpc
from tests.serve_helpers import MAX_NEW
from tests.typing_traces import QUESTIONS, typed

pytestmark = pytest.mark.slow


def _type_and_submit(stack, question: str):
    """Type `question` over the public gRPC API; (result, the gateway's link of the session)."""
    with HeadstartClient(stack.grpc_target, token="tok-alice") as client:
        with client.typing("world_1") as session:
            for text in typed(question):
                session.input(text)
            session.wait_caught_up()
            link = stack.gateway.service.get("alice", session.session_id).link
            result = session.submit(question, MAX_NEW)
    return result, link


def _locate(engine, session_id: str, with_secret: bool = True):
    metadata = engine.metadata(session_id) if with_secret else (("application", engine.app_name),
                                                                ("session_id", session_id))
    with grpc.insecure_channel(engine.grpc_target) as channel:
        return engine_pb2_grpc.EngineStub(channel).Locate(engine_pb2.EngineSessionRef(session_id=session_id),
                                                          metadata=metadata, timeout=30)


def test_sessions_stream_directly_with_the_tokens_of_the_proxy_path(serve_stack, make_gateway):
    question = QUESTIONS[1]
    direct_result, direct_link = _type_and_submit(serve_stack, question)
    assert direct_link.path == "direct"
    assert serve_stack.gateway.service.direct.opened_by_path["direct"] > 0
    proxied = make_gateway(engine_direct=False)
    proxy_result, proxy_link = _type_and_submit(proxied, question)
    assert proxy_link.path == "proxy"
    assert proxied.gateway.service.direct.opened_by_path == {"direct": 0, "proxy": 1}
    assert list(direct_result.token_ids) == list(proxy_result.token_ids) and len(direct_result.token_ids) > 0
    assert direct_result.cached_tokens_at_submit > 0


def test_locate_names_the_replica_that_holds_the_session(serve_stack, serve_engine):
    _, link = _type_and_submit(serve_stack, QUESTIONS[2])
    where = _locate(serve_engine, link.engine_session_id)
    assert where.replica == link.replica
    host, _, port = where.direct_target.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0  # the local stack keeps it on loopback


def test_locate_and_the_direct_port_want_the_engine_secret(serve_engine):
    with pytest.raises(grpc.RpcError) as err:
        _locate(serve_engine, "no-secret", with_secret=False)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    target = _locate(serve_engine, "with-secret").direct_target
    attach = engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="x", db="world_1", policy="headstart"))
    with grpc.insecure_channel(target) as channel:
        events = list(engine_pb2_grpc.EngineStub(channel).Session(iter([attach]), timeout=30,
                                                                 metadata=(("session_id", "x"),)))
    assert [e.WhichOneof("kind") for e in events] == ["error"]
    assert events[0].error.code == "UNAUTHENTICATED"


def test_a_dead_address_falls_back_to_the_proxy(make_gateway, monkeypatch):
    stack = make_gateway()
    channels = stack.gateway.service.direct

    async def dead_address(proxy_stub, session_id, metadata):
        return "127.0.0.1:1"  # nothing listens on port 1

    monkeypatch.setattr(channels, "locate", dead_address)
    result, link = _type_and_submit(stack, QUESTIONS[3])
    assert link.path == "proxy" and len(result.token_ids) > 0
    assert channels.opened_by_path["direct"] == 0 and channels.opened_by_path["proxy"] >= 1
