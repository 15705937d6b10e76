"""One session's stream to the engine, routed by Serve, with reconnect.

Every call carries `session_id` metadata, so Serve's ConsistentHashRouter
sends it to the replica holding the session. The stream itself goes to that
replica's own port when it serves one (`Locate`, services/engine/direct.py),
else through Serve's gRPC proxy. When the stream breaks (the
replica died, was drained, or the ring moved), the link reopens it and sends
`attach` with the newest snapshot: the replica it reaches rebuilds the
session. A submit still waiting for its result is sent again, and the tokens
already forwarded to the client are skipped (decoding is deterministic for a
given prompt, seed and parameters).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

import grpc

from headstart.client.errors import ApiError
from headstart.v1 import engine_pb2, engine_pb2_grpc, types_pb2
from services.gateway.engine_direct import DirectChannels

log = logging.getLogger(__name__)


@dataclass
class PendingSubmit:
    seq: int
    text: str
    params: types_pb2.SamplingParams
    candidates: types_pb2.CandidatesRequest | None = None
    check_limits: engine_pb2.CheckLimits | None = None
    forwarded_tokens: int = 0
    result_forwarded: bool = False  # its Result is out; a Choice is still owed (num_candidates > 1)


class EngineLink:
    """Owns the `Engine.Session` call of one gateway session."""

    def __init__(self, stub: engine_pb2_grpc.EngineStub, app_name: str, engine_session_id: str, db: str,
                 policy: str, latest: Callable[[], tuple[int, str]],
                 on_event: Callable[[engine_pb2.EngineEvent], None],
                 on_ack_rtt: Callable[[float], None] = lambda s: None, reconnect_timeout_s: float = 60.0,
                 extra_metadata: tuple[tuple[str, str], ...] = (), direct: DirectChannels | None = None,
                 candidates: types_pb2.CandidatesRequest | None = None):
        self.stub, self.db, self.policy = stub, db, policy
        self.candidates = candidates  # the session's, decoded during pauses (None: the engine's default)
        self._direct = direct  # None: always through Serve's proxy
        self.path = ""  # how the current stream reached its replica: direct or proxy
        # extra_metadata: the engine secret (services/engine/guard.py)
        self.metadata = (("application", app_name), ("session_id", engine_session_id), *extra_metadata)
        self.engine_session_id = engine_session_id
        self._latest, self._on_event, self._on_ack_rtt = latest, on_event, on_ack_rtt
        self.reconnect_timeout_s = reconnect_timeout_s
        self.replica = ""
        self.num_reconnects = 0
        self._call = None
        self._reader: asyncio.Task | None = None
        self._closed = False
        self.failed = False  # reconnecting gave up: the session must be reopened
        self._pending: PendingSubmit | None = None
        self._skip_tokens = 0
        self._skip_result = False  # a resent submit's Result was forwarded already
        self._sent_at: dict[int, float] = {}
        self._sent_seq = 0  # the newest snapshot seq written to the current call (attach included)

    async def start(self) -> None:
        """Open the stream and attach; raises ApiError (e.g. RESOURCE_EXHAUSTED, NOT_FOUND)."""
        await self._open()
        self._reader = asyncio.create_task(self._read_loop())

    async def send_snapshot(self, seq: int, text: str) -> None:
        if len(self._sent_at) > 1024:
            self._sent_at.clear()
        self._sent_at[seq] = time.perf_counter()
        if await self._write(engine_pb2.EngineRequest(snapshot=engine_pb2.Snapshot(seq=seq, text=text))):
            self._sent_seq = max(self._sent_seq, seq)

    async def send_submit(self, seq: int, text: str, params: types_pb2.SamplingParams,
                          candidates: types_pb2.CandidatesRequest | None = None,
                          check_limits: engine_pb2.CheckLimits | None = None) -> None:
        self._pending = PendingSubmit(seq, text, params, candidates, check_limits)
        self._skip_tokens, self._skip_result = 0, False
        await self._write(self._submit_request(self._pending))

    async def cancel_generation(self) -> None:
        self._pending = None
        await self._write(engine_pb2.EngineRequest(cancel=engine_pb2.CancelGeneration()))

    async def close(self) -> None:
        """Cancel the call (the replica cancels any generation and detaches)."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()

    # -- internals ----------------------------------------------------------

    async def _open(self) -> None:
        seq, text = self._latest()
        attach = engine_pb2.Attach(session_id=self.engine_session_id, db=self.db, policy=self.policy, seq=seq, text=text,
                                   candidates=self.candidates)
        call = first = None
        # Serve's proxy routes (Locate is sticky like every call of the session); the stream
        # itself goes straight to that replica's port when it has one (services/engine/direct.py)
        target = await self._direct.locate(self.stub, self.engine_session_id, self.metadata) if self._direct else ""
        if target:
            try:
                call, first = await self._attach(await self._direct.connect(target), attach)
                self.path = "direct"
            except (grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
                self._direct.failed(target, exc)
        if call is None:
            call, first = await self._attach(self.stub, attach)
            self.path = "proxy"
        if self._direct is not None:
            self._direct.opened(self.path)
        if first is grpc.aio.EOF:
            raise ApiError("UNAVAILABLE", "the engine closed the stream at attach")
        if first.WhichOneof("kind") == "error":
            call.cancel()
            raise ApiError(first.error.code, first.error.message)
        self.replica = first.attached.replica
        self._call, self._sent_seq = call, seq
        # NOTE: snapshots typed while this attach was on its way were written to
        # the broken call and lost; nothing else re-sends them (the next
        # keystroke may never come: the user stopped typing), so the rebuilt
        # session would never catch up with the text typed during the failover.
        await self._send_newest()
        if self._pending is not None:  # a submit the broken stream never answered
            self._skip_tokens = self._pending.forwarded_tokens
            self._skip_result = self._pending.result_forwarded
            await call.write(self._submit_request(self._pending))

    async def _attach(self, stub, attach: engine_pb2.Attach):
        """Open `Session` on `stub` and send `attach`: (the call, its first event)."""
        call = stub.Session(metadata=self.metadata)
        try:
            await call.write(engine_pb2.EngineRequest(attach=attach))
            return call, await call.read()
        except BaseException:  # closed while attaching, or the call failed: leave nothing open on a replica
            call.cancel()
            raise

    async def _send_newest(self) -> None:
        """Send the newest snapshot when the current call has not seen it."""
        seq, text = self._latest()
        if seq > self._sent_seq:
            await self.send_snapshot(seq, text)

    async def _read_loop(self) -> None:
        while not self._closed:
            try:
                event = await self._call.read()
                if event is grpc.aio.EOF:
                    raise ConnectionError("engine stream ended")
                self._dispatch(event)
                continue
            except asyncio.CancelledError:
                raise
            except (grpc.aio.AioRpcError, ConnectionError) as exc:
                if self._closed:
                    return
                self._call = None  # writes until the reattach are dropped; _open sends the newest text
                log.info("engine stream of %s broke (%s); reconnecting", self.engine_session_id, exc)
            if not await self._reconnect():
                self.failed = True
                return

    async def _reconnect(self) -> bool:
        deadline = time.monotonic() + self.reconnect_timeout_s
        delay = 0.05
        while not self._closed:
            try:
                await self._open()
                self.num_reconnects += 1
                return True
            except ApiError as exc:
                if exc.code != "UNAVAILABLE":
                    self._on_event(_error(exc.code, exc.message))
                    return False
            except grpc.aio.AioRpcError as exc:
                log.debug("reconnect of %s failed: %s", self.engine_session_id, exc.code())
            if time.monotonic() > deadline:
                self._on_event(_error("UNAVAILABLE", f"engine unreachable for {self.reconnect_timeout_s:g} s"))
                return False
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)
        return False

    def _dispatch(self, event: engine_pb2.EngineEvent) -> None:
        kind = event.WhichOneof("kind")
        if kind == "ack":
            sent = self._sent_at.pop(event.ack.seq, None)
            if sent is not None:
                self._on_ack_rtt(time.perf_counter() - sent)
            return
        if kind == "attached":
            self.replica = event.attached.replica
            return
        if kind == "tokens" and self._pending is not None:
            n = len(event.tokens.token_ids)
            if self._skip_tokens > 0 and n:
                self._skip_tokens -= n
                return
            self._pending.forwarded_tokens += n
        elif kind == "result":
            if self._skip_result:  # the answer of a resent submit: only its Choice is news
                self._skip_result = False
                return
            if self._pending is not None and event.result.num_candidates > 1:
                self._pending.result_forwarded = True  # a Choice follows: resent if the stream breaks first
            else:
                self._pending = None
        elif kind == "choice" or (kind == "error" and self._pending is not None
                                  and event.error.seq == self._pending.seq):
            self._pending = None
        self._on_event(event)

    async def _write(self, request: engine_pb2.EngineRequest) -> bool:
        """Write on the current call; False when there is none, it broke, or a
        reattach replaced it meanwhile (the write went to the old call)."""
        call = self._call
        if call is None or self._closed:
            return False
        try:
            await call.write(request)
            return call is self._call
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, RuntimeError) as exc:
            # The read loop sees the break and reattaches with the newest snapshot.
            log.debug("write to engine failed: %r", exc)
            return False

    @staticmethod
    def _submit_request(p: PendingSubmit) -> engine_pb2.EngineRequest:
        return engine_pb2.EngineRequest(submit=engine_pb2.EngineSubmit(
            seq=p.seq, text=p.text, params=p.params, candidates=p.candidates, check_limits=p.check_limits))


def _error(code: str, message: str) -> engine_pb2.EngineEvent:
    return engine_pb2.EngineEvent(error=types_pb2.Error(code=code, message=message))
