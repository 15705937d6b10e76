"""Integration faults on the real stack (Ray Serve, gateway, Python client):

- a client that leaves mid-generation frees the replica's forward worker at
  once (measured with the engine's Describe: jobs queued or running fall to 0);
- the gateway restarted under a typing session: the sync and the async client
  reconnect by themselves, re-send the newest snapshot, and the answer is the
  same tokens as a cold run (float64).
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from headstart.client import AsyncHeadstartClient, HeadstartClient
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.ray_stack import free_port
from services.gateway.sessions import engine_session_id
from tests.serve_fixture import MAX_ATTACHED, NUM_REPLICAS, TOKENS
from tests.serve_helpers import MAX_NEW, recv, recv_until, ws_connect
from tests.typing_traces import QUESTIONS, typed

pytestmark = pytest.mark.slow
LONG_ANSWER = 512  # the gateway's max_new_tokens limit: a generation far longer than the wait below
IDLE_POLLS = 20  # consecutive Describe polls with nothing queued or running = the work is gone


def _describe(serve_engine, engine_sid: str, stub) -> engine_pb2.EngineSessionInfo:
    md = serve_engine.metadata(engine_sid)
    return stub.Describe(engine_pb2.EngineSessionRef(session_id=engine_sid), metadata=md, timeout=30)


def _seconds_until_idle(serve_engine, engine_sid: str, deadline_s: float = 30.0) -> float:
    """Seconds from now until the replica of `engine_sid` has had no forward job,
    queued or running, for IDLE_POLLS polls in a row (fails past the deadline)."""
    start = time.perf_counter()
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        idle_since, idle_polls = None, 0
        while idle_polls < IDLE_POLLS:
            assert time.perf_counter() - start < deadline_s, "the replica kept working for a client that left"
            if _describe(serve_engine, engine_sid, stub).num_queued == 0:
                idle_since = idle_since or time.perf_counter()
                idle_polls += 1
            else:
                idle_since, idle_polls = None, 0
            time.sleep(0.01)
    return idle_since - start


def _busy_now(serve_engine, engine_sid: str) -> bool:
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        return any(_describe(serve_engine, engine_sid, stub).num_queued for _ in range(IDLE_POLLS))


@pytest.mark.parametrize("edge", ["ws", "grpc"])
def test_client_leaving_mid_generation_frees_the_worker(serve_stack, serve_engine, edge):
    question = QUESTIONS[0]
    if edge == "ws":
        with ws_connect(serve_stack) as ws:
            sid = recv(ws)["session"]
            for seq, text in enumerate(typed(question), 1):
                ws.send(json.dumps({"type": "input", "seq": seq, "text": text}))
            ws.send(json.dumps({"type": "submit", "seq": len(question) + 1, "text": question,
                                "max_new_tokens": LONG_ANSWER}))
            stamps = []
            for _ in range(4):
                assert recv_until(ws, {"token", "done", "error"})[0]["type"] == "token"
                stamps.append(time.perf_counter())
            per_token = (stamps[-1] - stamps[0]) / 3
            busy = _busy_now(serve_engine, engine_session_id("alice", sid))
        # leaving the `with` closed the WebSocket mid-answer
    else:
        with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
            session = client.typing("world_1")
            sid = session.session_id
            for text in typed(question):
                session.input(text)
            session.send_submit(question, LONG_ANSWER)
            stamps = []
            while len(stamps) < 4:
                kind = session.next_event(60).WhichOneof("kind")
                assert kind not in ("result", "error")
                if kind == "tokens":
                    stamps.append(time.perf_counter())
            per_token = (stamps[-1] - stamps[0]) / 3
            busy = _busy_now(serve_engine, engine_session_id("alice", sid))
            session.cancel()  # the client goes away without a word
    freed_s = _seconds_until_idle(serve_engine, engine_session_id("alice", sid))
    print(f"\n{edge}: worker busy before leaving={busy}; freed {freed_s * 1000:.0f} ms after the client left; "
          f"the rest of the answer would have taken ~{per_token * (LONG_ANSWER - 4):.1f} s")
    assert busy, "the generation was not running when the client left (nothing to free)"


def _gateway_on(serve_engine, http_port: int, grpc_port: int):
    from services.gateway.app import GatewayServer
    from services.gateway.settings import GatewaySettings

    settings = GatewaySettings(host="127.0.0.1", port=http_port, grpc_port=grpc_port,
                               engine_target=serve_engine.grpc_target, engine_app=serve_engine.app_name,
                               tokens=TOKENS, engine_secret=serve_engine.secret,
                               engine_capacity=MAX_ATTACHED * NUM_REPLICAS)
    return GatewayServer(settings).start()


def test_sync_client_resumes_after_gateway_restart(serve_engine, tiny_runtime):
    question = QUESTIONS[1]
    half = len(question) // 2
    expected = tiny_runtime.complete("world_1", question, "cold", MAX_NEW).token_ids
    ports = free_port(), free_port()
    gateway = _gateway_on(serve_engine, *ports)
    try:
        with HeadstartClient(f"127.0.0.1:{ports[1]}", token="tok-alice", reconnect_timeout_s=60) as client:
            session = client.typing("world_1")
            first_id = session.session_id
            for text in typed(question[:half]):
                session.input(text)
            session.wait_caught_up()
            gateway.stop()
            gateway = _gateway_on(serve_engine, *ports)  # the same address: the client finds it again
            for text in typed(question[half:], question[:half]):
                session.input(text)
            result = session.submit(question, MAX_NEW)
            session.close()
    finally:
        gateway.stop()
    assert list(result.token_ids) == expected
    assert session.num_reconnects >= 1 and session.session_id != first_id  # a rebuilt session


def test_async_client_resumes_after_gateway_restart(serve_engine, tiny_runtime):
    question = QUESTIONS[2]
    expected = tiny_runtime.complete("world_1", question, "cold", MAX_NEW).token_ids
    ports = free_port(), free_port()
    gateways = [_gateway_on(serve_engine, *ports)]

    async def scenario():
        async with AsyncHeadstartClient(f"127.0.0.1:{ports[1]}", token="tok-bob", reconnect_timeout_s=60) as client:
            session = await client.typing("world_1")
            first_id = session.session_id
            for text in typed(question):
                await session.input(text)
            await asyncio.to_thread(gateways[0].stop)
            gateways.append(await asyncio.to_thread(_gateway_on, serve_engine, *ports))
            streamed: list[str] = []
            result = await session.submit(question, MAX_NEW, on_text=streamed.append)
            await session.close()
            return session, first_id, result, "".join(streamed)

    try:
        session, first_id, result, streamed = asyncio.run(scenario())
    finally:
        gateways[-1].stop()
    assert list(result.token_ids) == expected
    assert streamed == result.text  # no token delivered twice
    assert session.num_reconnects >= 1 and session.session_id != first_id
