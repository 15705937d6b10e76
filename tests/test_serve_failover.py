"""Integration: a session survives the death of its replica (ray.kill): the
gateway reattaches, another replica rebuilds it from the snapshot, and the
answer is the same tokens as a cold run. Killed mid-typing or mid-generation
(the client then gets the whole answer, no token twice, or a retryable
UNAVAILABLE within a deadline: never a hang). Each prints what the kill cost."""

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
# Generous: the catch-up takes 1-3 s (router update + reattach + rebuild); the
# bound only catches a session that waits on its client's next keystroke.
CATCH_UP_BOUND_S = 30.0


def _replica_of(serve_engine, engine_sid: str) -> engine_pb2.EngineSessionInfo:
    import grpc

    md = serve_engine.metadata(engine_sid)
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        return engine_pb2_grpc.EngineStub(channel).Describe(engine_pb2.EngineSessionRef(session_id=engine_sid),
                                                           metadata=md, timeout=30)


def _wait_replicas_running(serve_engine, timeout_s: float = 120.0) -> None:
    """Until Serve runs NUM_REPLICAS replicas again and the proxy routes to all of them
    (the next test's sessions must not move when the router hears of the replacement)."""
    from ray import serve

    from services.engine.ray_stack import EngineStack, wait_ready

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        app = serve.status().applications.get("headstart-engine")
        deployment = app.deployments["Engine"] if app else None
        if deployment and deployment.status == "HEALTHY" and \
                deployment.replica_states.get("RUNNING", 0) == NUM_REPLICAS and len(deployment.replica_states) == 1:
            stack = EngineStack(serve_engine.grpc_target, serve_engine.app_name, serve_engine.secret)
            wait_ready(stack, timeout_s=max(1.0, end - time.monotonic()), replicas=NUM_REPLICAS)
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
            killed = time.perf_counter()
            for text in typed(question[half:], question[:half]):
                session.input(text)
            # Bounded: text typed while the gateway reattached reaches the rebuilt
            # session at once (it used to wait for a keystroke that never came).
            session.wait_caught_up(CATCH_UP_BOUND_S)
            caught_up = f"{(time.perf_counter() - killed) * 1000:.0f} ms"
            sent = time.perf_counter()
            result = session.submit(question, MAX_NEW)
            waited_ms = (time.perf_counter() - sent) * 1000
    assert list(result.token_ids) == expected
    assert result.replica != before.replica
    print(f"\nkilled mid-typing: the new replica held the whole typed prompt {caught_up} after the kill "
          f"(reattach + rebuild); then submit -> result {waited_ms:.0f} ms (engine TTFT "
          f"{result.ttft_ms:.0f} ms, {result.computed_tokens_at_submit} of {result.prompt_tokens} prompt tokens "
          f"computed at submit)")
    _wait_replicas_running(serve_engine)


def test_replica_killed_mid_generation_answers_or_fails_retryably(serve_stack, serve_engine, tiny_runtime):
    import ray

    question, max_new, deadline_s = QUESTIONS[0], 160, 120.0
    expected = tiny_runtime.complete("world_1", question, "cold", max_new).token_ids
    streamed, result, error = [], None, None
    with HeadstartClient(serve_stack.grpc_target, token="tok-bob") as client:
        with client.typing("world_1") as session:
            for text in typed(question):
                session.input(text)
            session.wait_caught_up()
            sent = time.perf_counter()
            session.send_submit(question, max_new)
            while not streamed:  # the answer has begun
                event = session.next_event(60)
                assert event.WhichOneof("kind") not in ("result", "error")
                if event.WhichOneof("kind") == "tokens":
                    streamed.append(event.tokens.text)
            before = _replica_of(serve_engine, engine_session_id("bob", session.session_id))
            ray.kill(ray.get_actor(before.replica, namespace="serve"), no_restart=True)
            killed = time.perf_counter()
            while result is None and error is None:  # TimeoutError here = a hang
                event = session.next_event(max(0.1, deadline_s - (time.perf_counter() - killed)))
                kind = event.WhichOneof("kind")
                if kind == "tokens":
                    streamed.append(event.tokens.text)
                elif kind == "result":
                    result, done = event.result, time.perf_counter()
                elif kind == "error":
                    error = event.error
    if result is not None:
        assert list(result.token_ids) == expected
        assert "".join(streamed) == result.text  # resubmitted on the new replica, no token twice
        print(f"\nkilled mid-generation: whole answer from {result.replica != before.replica and 'another' or 'the'}"
              f" replica {(done - sent) * 1000:.0f} ms after submit, {(done - killed) * 1000:.0f} ms after the kill, "
              f"{len(streamed)} text pieces")
    else:
        assert error.code == "UNAVAILABLE", error  # retryable: the client may submit again
    _wait_replicas_running(serve_engine)
