"""EngineLink's reattach, on a scripted stub (logic only; the real failover is
tests/test_serve_failover.py): text typed while the reattach is on its way
reaches the rebuilt session without waiting for another keystroke."""

from __future__ import annotations

import asyncio

import grpc

from headstart.v1 import engine_pb2, types_pb2
from services.gateway.engine_link import EngineLink


class ScriptedCall:
    """One `Engine.Session` call: records writes; `read` answers the attach
    once `attach_gate` is set, then ends (EOF) when `broken` is set."""

    def __init__(self, attach_gate: asyncio.Event, broken: asyncio.Event):
        self.writes: list[engine_pb2.EngineRequest] = []
        self.attach_gate, self.broken = attach_gate, broken
        self.attached_sent = False

    async def write(self, request: engine_pb2.EngineRequest) -> None:
        self.writes.append(request)

    async def read(self):
        if not self.attached_sent:
            await self.attach_gate.wait()
            self.attached_sent = True
            return engine_pb2.EngineEvent(attached=engine_pb2.Attached(replica=f"r{id(self)}", rebuilt=True))
        await self.broken.wait()
        return grpc.aio.EOF

    def cancel(self) -> None:
        self.broken.set()

    def snapshot_seqs(self) -> list[int]:
        return [w.snapshot.seq for w in self.writes if w.WhichOneof("kind") == "snapshot"]

    def attach_seq(self) -> int:
        return self.writes[0].attach.seq


class ScriptedStub:
    def __init__(self):
        self.calls: list[ScriptedCall] = []
        self.gates: list[asyncio.Event] = []

    def Session(self, metadata=()):  # noqa: N802 (the stub's RPC name)
        gate = asyncio.Event()
        call = ScriptedCall(gate, asyncio.Event())
        self.calls.append(call)
        self.gates.append(gate)
        return call


def _link(stub: ScriptedStub, latest: dict) -> EngineLink:
    return EngineLink(stub, "app", "sid", "world_1", "headstart", lambda: (latest["seq"], latest["text"]),
                      on_event=lambda event: None)


async def _until(predicate, timeout_s: float = 5.0) -> None:
    end = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < end, "timed out"
        await asyncio.sleep(0.001)


def test_text_typed_during_a_reattach_reaches_the_new_call():
    async def scenario():
        stub, latest = ScriptedStub(), {"seq": 3, "text": "How"}
        link = _link(stub, latest)
        stub_gate_open = asyncio.create_task(link.start())
        await _until(lambda: stub.gates)
        stub.gates[0].set()
        await stub_gate_open
        old = stub.calls[0]
        old.broken.set()  # the replica died: the read loop reattaches
        await _until(lambda: len(stub.calls) == 2 and stub.calls[1].writes)
        new = stub.calls[1]
        assert new.attach_seq() == 3
        # keystrokes arrive while the attach is on its way; the user then stops typing
        for seq, text in ((4, "How "), (5, "How m")):
            latest.update(seq=seq, text=text)
            await link.send_snapshot(seq, text)
        assert new.snapshot_seqs() == []
        stub.gates[1].set()
        await _until(lambda: link.num_reconnects == 1)
        await link.close()
        return new

    new = asyncio.run(scenario())
    assert new.snapshot_seqs() == [5]  # the newest text, once, with no further keystroke
    assert new.writes[-1].snapshot.text == "How m"


def test_a_reattach_with_the_newest_text_sends_nothing_more():
    async def scenario():
        stub, latest = ScriptedStub(), {"seq": 2, "text": "Ho"}
        link = _link(stub, latest)
        start = asyncio.create_task(link.start())
        await _until(lambda: stub.gates)
        stub.gates[0].set()
        await start
        latest.update(seq=3, text="How")
        await link.send_snapshot(3, "How")
        stub.calls[0].broken.set()
        await _until(lambda: len(stub.calls) == 2)
        stub.gates[1].set()
        await _until(lambda: link.num_reconnects == 1)
        await link.close()
        return stub.calls

    old, new = asyncio.run(scenario())
    assert old.snapshot_seqs() == [3]
    assert new.attach_seq() == 3 and new.snapshot_seqs() == []


def test_a_submit_pending_across_a_reattach_is_sent_after_the_newest_text():
    async def scenario():
        stub, latest = ScriptedStub(), {"seq": 1, "text": "H"}
        link = _link(stub, latest)
        start = asyncio.create_task(link.start())
        await _until(lambda: stub.gates)
        stub.gates[0].set()
        await start
        stub.calls[0].broken.set()
        await _until(lambda: len(stub.calls) == 2 and stub.calls[1].writes)
        latest.update(seq=2, text="Hi")  # Enter pressed while the attach is on its way
        await link.send_submit(2, "Hi", types_pb2.SamplingParams(max_new_tokens=4))
        stub.gates[1].set()
        await _until(lambda: link.num_reconnects == 1)
        await link.close()
        return stub.calls[1]

    new = asyncio.run(scenario())
    kinds = [w.WhichOneof("kind") for w in new.writes]
    assert kinds == ["attach", "snapshot", "submit"]
    assert new.writes[1].snapshot.seq == 2 and new.writes[2].submit.seq == 2


def test_a_submit_whose_choice_is_owed_is_resent_and_only_the_choice_forwarded():
    """A Result with num_candidates > 1 leaves the submit pending: a break before its Choice
    re-sends it (with its candidates), and of the re-run only the Choice reaches the client."""
    forwarded: list[str] = []

    async def scenario():
        stub, latest = ScriptedStub(), {"seq": 2, "text": "Hi"}
        link = EngineLink(stub, "app", "sid", "world_1", "headstart", lambda: (latest["seq"], latest["text"]),
                          on_event=lambda event: forwarded.append(event.WhichOneof("kind")),
                          candidates=types_pb2.CandidatesRequest(k=3))
        start = asyncio.create_task(link.start())
        await _until(lambda: stub.gates)
        stub.gates[0].set()
        await start
        await link.send_submit(2, "Hi", types_pb2.SamplingParams(max_new_tokens=4),
                               types_pb2.CandidatesRequest(k=3, wait_all=True), engine_pb2.CheckLimits(rows=5))
        answer = [engine_pb2.EngineEvent(tokens=types_pb2.Tokens(text="SEL", token_ids=[1, 2])),
                  engine_pb2.EngineEvent(result=types_pb2.Result(seq=2, num_candidates=3))]
        for event in answer:
            link._dispatch(event)
        stub.calls[0].broken.set()  # the replica died before the Choice
        await _until(lambda: len(stub.calls) == 2 and stub.calls[1].writes)
        stub.gates[1].set()
        await _until(lambda: link.num_reconnects == 1)
        for event in [*answer, engine_pb2.EngineEvent(choice=types_pb2.Choice(seq=2, num_candidates=3))]:
            link._dispatch(event)  # the re-sent submit's answer
        pending = link._pending
        await link.close()
        return stub.calls, pending

    (old, new), pending = asyncio.run(scenario())
    assert old.writes[0].attach.candidates.k == 3 and new.writes[0].attach.candidates.k == 3
    resent = new.writes[-1].submit
    assert (resent.seq, resent.candidates.k, resent.candidates.wait_all, resent.check_limits.rows) == (2, 3, True, 5)
    assert forwarded == ["tokens", "result", "choice"] and pending is None
