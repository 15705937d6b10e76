"""One gateway→replica session stream: attach, snapshots, submits, events out.

The first request must be `attach` (session id, db, latest snapshot): the
replica reuses the session it holds or rebuilds it from that snapshot. Then
every snapshot is acked and fed to the session (its background prefill runs
at STREAM priority on the worker); a submit runs at SUBMIT priority and
streams tokens. A snapshot newer than the running submit cancels it (the user
edited after Enter), and so does the end of the stream (the client left).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Callable

from headstart.engine.requests.generation import SamplingParams
from headstart.engine.sessions.session import Session
from headstart.v1 import engine_pb2, types_pb2
from services.engine import events
from services.engine.checks import answer_events, candidates_of
from services.engine.core import ReplicaCore

_END = object()
DEFAULT_MAX_NEW_TOKENS = 128


def sampling_params(proto: types_pb2.SamplingParams, default_max_new: int = DEFAULT_MAX_NEW_TOKENS) -> SamplingParams:
    """SamplingParams from the wire (0 = default); raises InvalidInput when out of range."""
    params = SamplingParams(
        max_new_tokens=proto.max_new_tokens or default_max_new, temperature=proto.temperature,
        top_p=proto.top_p or 1.0, seed=proto.seed, top_k=proto.top_k, min_new_tokens=proto.min_new_tokens,
        ignore_eos=proto.ignore_eos, presence_penalty=proto.presence_penalty,
        frequency_penalty=proto.frequency_penalty, repetition_penalty=proto.repetition_penalty or 1.0,
        stop=tuple(proto.stop), logprobs=proto.logprobs, top_logprobs=proto.top_logprobs,
    )
    params.validate()
    return params


class SessionStream:
    """Serves one `Engine.Session` call on a replica."""

    def __init__(self, core: ReplicaCore, replica: str, prepare: Callable[[str], Awaitable[str]] | None = None,
                 tenant: str | None = None):
        self.core, self.replica = core, replica
        self.tenant = tenant  # whose work the session's jobs are (the scheduler's fairness)
        self._prepare = prepare  # catalogue name -> loaded spec (None: the name is the spec)
        self._out: asyncio.Queue = asyncio.Queue()
        self._session: Session | None = None
        self._spec = ""  # the session's database (its candidates' SQL runs there)
        self._gen_task: asyncio.Task | None = None
        self._gen_seq = 0

    async def run(self, requests: AsyncIterator[engine_pb2.EngineRequest]
                  ) -> AsyncIterator[engine_pb2.EngineEvent]:
        """Events for the gateway until the request stream ends or attach fails."""
        reader = asyncio.create_task(self._read(requests))
        try:
            while (item := await self._out.get()) is not _END:
                yield item
        finally:
            reader.cancel()
            self._cancel_generation()
            if self._session is not None:
                self._session.on_progress = None
                self.core.detach(self._session.session_id)

    # -- reading requests ---------------------------------------------------

    async def _read(self, requests: AsyncIterator[engine_pb2.EngineRequest]) -> None:
        try:
            first = await anext(requests, None)
            if first is None or first.WhichOneof("kind") != "attach":
                self._post(events.error("INVALID_ARGUMENT", "the first message must be attach"))
                return
            if not await self._attach(first.attach):
                return
            async for request in requests:
                kind = request.WhichOneof("kind")
                if kind == "snapshot":
                    self._snapshot(request.snapshot.seq, request.snapshot.text)
                elif kind == "submit":
                    self._submit(request.submit)
                elif kind == "cancel":
                    self._cancel_generation("cancelled by the client")
                else:
                    self._post(events.error("INVALID_ARGUMENT", f"unexpected message {kind!r} after attach"))
            await self._drain_generation()  # half-close after a submit: finish it, then end
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stream broke: report and end, never hang the gateway
            self._post(events.from_exception(exc))
        finally:
            self._post(_END)

    async def _attach(self, attach: engine_pb2.Attach) -> bool:
        try:
            spec = await self._prepare(attach.db) if self._prepare is not None else attach.db
            candidates = candidates_of(attach.candidates, self.core.runtime.settings)
            result = await asyncio.to_thread(self.core.attach, attach.session_id, spec, attach.policy or "headstart",
                                             self.tenant, candidates)
        except Exception as exc:
            self._post(events.from_exception(exc, attach.seq))
            return False
        self._session = session = result.session
        self._spec = spec
        loop = asyncio.get_running_loop()
        schema_tokens = len(session.prompt.base_ids)  # P0: what every snapshot's prompt starts with

        def on_progress(seq: int, cached: int, prompt_tokens: int) -> None:  # worker thread: never block
            try:
                loop.call_soon_threadsafe(self._out.put_nowait,
                                          events.progress(seq, cached, prompt_tokens, schema_tokens))
            except RuntimeError:
                pass

        session.on_progress = on_progress
        self._post(events.attached(self.replica, result.rebuilt))
        if attach.seq > 0:
            self._snapshot(attach.seq, attach.text, ack=False)
        seq, cached, prompt_tokens = await asyncio.to_thread(session.progress)
        self._post(events.progress(max(seq, 0), cached, prompt_tokens, schema_tokens))
        return True

    def _snapshot(self, seq: int, text: str, ack: bool = True) -> None:
        if self._generation_running() and seq > self._gen_seq:
            self._cancel_generation("a newer snapshot replaced the submitted text")  # edited after Enter
        try:
            self._session.update(seq, text)
        except Exception as exc:
            self._post(events.from_exception(exc, seq))
            return
        if ack:
            self._post(events.ack(seq, self.replica))

    def _submit(self, submit: engine_pb2.EngineSubmit) -> None:
        if self._generation_running():
            self._post(events.error("INVALID_ARGUMENT", "a generation is already running", submit.seq))
            return
        try:
            params = sampling_params(submit.params)
            asked = candidates_of(submit.candidates, self.core.runtime.settings)  # None: the session's
            request = self._session.submit(submit.seq, submit.text, params, candidates=asked)
        except Exception as exc:
            self._post(events.from_exception(exc, submit.seq))
            return
        self._gen_seq = submit.seq
        decode = self._session.prompt.decode
        # the tokens, the Result, then (with candidates) the Choice: the answer runs until its Choice
        self._gen_task = asyncio.create_task(self._forward(answer_events(
            request, decode, self.replica, submit.seq, self.core.checks, self._spec, submit.check_limits,
            submit.candidates.wait_all)))

    # -- generation ---------------------------------------------------------

    async def _forward(self, stream: AsyncIterator[engine_pb2.EngineEvent]) -> None:
        async for event in stream:
            self._post(event)

    def _generation_running(self) -> bool:
        return self._gen_task is not None and not self._gen_task.done()

    def _cancel_generation(self, reason: str = "") -> None:
        """Stop the running generation; with a `reason`, tell the gateway (CANCELLED)."""
        if self._generation_running():
            self._gen_task.cancel()
            if reason:
                self._post(events.error("CANCELLED", reason, self._gen_seq))

    async def _drain_generation(self) -> None:
        if self._generation_running():
            try:
                await self._gen_task
            except asyncio.CancelledError:
                pass

    def _post(self, item: object) -> None:
        self._out.put_nowait(item)

