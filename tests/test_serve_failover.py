"""Integration: a session survives the death of its replica (ray.kill): the
gateway reattaches, another replica rebuilds it from the snapshot, and the
answer is the same tokens as a cold run."""

from __future__ import annotations

import time

import pytest

from headstart.client import HeadstartClient
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.gateway.sessions import engine_session_id
from tests.serve_fixture import NUM_REPLICAS
from tests.serve_helpers import MAX_NEW
from tests.typing_traces import QUESTIONS, typed

pytestmark = pytest.mark.slow


def _replica_of(serve_engine, engine_sid: str) -> engine_pb2.EngineSessionInfo:
    import grpc

    md = serve_engine.metadata(engine_sid)
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        return engine_pb2_grpc.EngineStub(channel).Describe(engine_pb2.EngineSessionRef(session_id=engine_sid),
                                                           metadata=md, timeout=30)


def _wait_replicas_running(timeout_s: float = 120.0) -> None:
    from ray import serve

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        app = serve.status().applications.get("headstart-engine")
        deployment = app.deployments["Engine"] if app else None
        if deployment and deployment.status == "HEALTHY" and \
                deployment.replica_states.get("RUNNING", 0) == NUM_REPLICAS and len(deployment.replica_states) == 1:
            return
        time.sleep(0.5)
    raise TimeoutError("the engine did not get back to its replicas")


def test_session_rebuilt_after_replica_killed(serve_stack, serve_engine, tiny_runtime):
    import ray

    question = QUESTIONS[3]
    half = len(question) // 2
    expected = tiny_runtime.complete("world_1", question, "cold", MAX_NEW).token_ids
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        with client.typing("world_1") as session:
            for text in typed(question[:half]):
                session.input(text)
            session.wait_caught_up()
            before = _replica_of(serve_engine, engine_session_id("alice", session.session_id))
            assert before.holds_session
            ray.kill(ray.get_actor(before.replica, namespace="serve"), no_restart=True)
            for text in typed(question[half:], question[:half]):
                session.input(text)
            result = session.submit(question, MAX_NEW)
    assert list(result.token_ids) == expected
    assert result.replica != before.replica
    _wait_replicas_running()
