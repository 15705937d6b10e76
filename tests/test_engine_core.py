"""ReplicaCore and SessionStream on a real runtime, without Ray: admission,
rebuild, acks, cancellation by a newer snapshot."""

from __future__ import annotations

import asyncio
import threading

import pytest

from headstart.engine.errors import InvalidInput, ResourceExhausted
from headstart.engine.sched.jobs import Priority
from headstart.v1 import engine_pb2, types_pb2
from services.engine.core import ReplicaCore
from services.engine.detok import TextDeltas
from services.engine.stream import SessionStream


@pytest.fixture
def core(tiny_runtime):
    core = ReplicaCore(tiny_runtime.settings, max_attached=2, runtime=tiny_runtime)
    yield core
    for sid in ("a", "b", "c"):
        core.close(sid)


def test_attach_admission_and_rebuild(core):
    first = core.attach("a", "world_1")
    again = core.attach("a", "world_1")  # a second stream of the same session takes no new slot
    core.attach("b", "world_1")
    with pytest.raises(ResourceExhausted):
        core.attach("c", "world_1")
    core.detach("b")
    third = core.attach("c", "world_1")
    assert (first.rebuilt, again.rebuilt, third.rebuilt) == (True, False, True)
    assert first.session is again.session
    info = core.info("a")
    assert (info.holds_session, info.num_attached) == (True, 2)


@pytest.mark.parametrize("session_id, policy", [("", "headstart"), ("a", "nope")])
def test_attach_rejects_bad_arguments(core, session_id, policy):
    with pytest.raises(InvalidInput):
        core.attach(session_id, "world_1", policy)


def test_attach_refused_when_queue_full(tiny_runtime, core):
    worker = tiny_runtime.worker
    gate = threading.Event()
    blocker = worker.enqueue(lambda: gate.wait(10) and False, Priority.FLASH, "block")
    saved, worker.max_queued = worker.max_queued, worker.num_queued  # full now
    try:
        with pytest.raises(ResourceExhausted):
            core.attach("a", "world_1")
    finally:
        worker.max_queued = saved
        gate.set()
        blocker.wait(10)
    assert core.info().num_attached == 0


async def _run_stream(core, requests: list[engine_pb2.EngineRequest], until) -> list[engine_pb2.EngineEvent]:
    queue: asyncio.Queue = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)

    async def source():
        while True:
            yield await queue.get()

    out = []
    stream = SessionStream(core, "replica-x").run(source())
    async for event in stream:
        out.append(event)
        if until(event):
            break
    await stream.aclose()
    return out


def test_stream_attach_ack_submit(core, tiny_runtime):
    question = "How many countries?"
    requests = [
        engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="a", db="world_1", seq=1, text="How")),
        engine_pb2.EngineRequest(snapshot=engine_pb2.Snapshot(seq=2, text="How many")),
        engine_pb2.EngineRequest(submit=engine_pb2.EngineSubmit(
            seq=3, text=question, params=types_pb2.SamplingParams(max_new_tokens=6))),
    ]
    events = asyncio.run(_run_stream(core, requests, lambda e: e.WhichOneof("kind") in ("result", "error")))
    kinds = [e.WhichOneof("kind") for e in events]
    result = events[-1].result
    assert kinds[0] == "attached" and events[0].attached.rebuilt
    assert [e.ack.seq for e in events if e.HasField("ack")] == [2]
    assert list(result.token_ids) == tiny_runtime.complete("world_1", question, "cold", 6).token_ids
    assert "".join(e.tokens.text for e in events if e.HasField("tokens")) == result.text
    assert core.info().num_attached == 0  # the stream's end gave the slot back


def test_stream_first_message_must_attach(core):
    requests = [engine_pb2.EngineRequest(snapshot=engine_pb2.Snapshot(seq=1, text="x"))]
    events = asyncio.run(_run_stream(core, requests, lambda e: True))
    assert [(e.error.code) for e in events] == ["INVALID_ARGUMENT"]


@pytest.mark.parametrize("ids, expected", [
    ([9707, 11], ["Hello", ","]),
    ([], []),
])
def test_text_deltas(tiny_runtime, ids, expected):
    tok = tiny_runtime.loaded.tokenizer
    deltas = TextDeltas(lambda xs: tok.decode(xs))
    assert [deltas.push(i) for i in ids] == expected
