"""asyncio client: the same API as `sync.py` on `grpc.aio`."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import grpc

from headstart.client.data import AsyncDataMethods
from headstart.client.errors import ApiError, from_rpc_error, is_transport_failure
from headstart.client.checked import CheckedAnswer, candidates_request
from headstart.client.sync import AnswerReader, auth_metadata, complete_request, complete_result, submit_request
from headstart.v1 import headstart_pb2, headstart_pb2_grpc, types_pb2


class AsyncHeadstartClient(AsyncDataMethods):
    """A connection to a gateway's public gRPC port (create it inside a running loop)."""

    def __init__(self, target: str, token: str | None = None, timeout_s: float = 120.0,
                 reconnect_timeout_s: float = 30.0):
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = headstart_pb2_grpc.HeadstartStub(self.channel)
        self.metadata = auth_metadata(token)
        self.timeout_s = timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s

    async def list_databases(self) -> list[headstart_pb2.Database]:
        return list((await self._unary(self.stub.ListDatabases, headstart_pb2.ListDatabasesRequest())).databases)

    async def open_session(self, db: str) -> str:
        return (await self._unary(self.stub.OpenSession, headstart_pb2.OpenSessionRequest(db=db))).session_id

    async def close_session(self, session_id: str) -> None:
        await self._unary(self.stub.CloseSession, headstart_pb2.CloseSessionRequest(session_id=session_id))

    async def complete(self, db: str, question: str, max_new_tokens: int | None = None, mode: str = "prefix",
                       on_text: Callable[[str], None] | None = None,
                       tables: list[str] | None = None) -> types_pb2.Result:
        """`HeadstartClient.complete`, awaited."""
        request = complete_request(db, question, max_new_tokens, mode, tables)
        try:
            async for response in self.stub.Complete(request, metadata=self.metadata, timeout=self.timeout_s):
                if (result := complete_result(response, on_text)) is not None:
                    return result
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        raise ApiError("INTERNAL", "the stream ended without a result")

    async def complete_checked(self, db: str, question: str, candidates: object = None,
                               max_new_tokens: int | None = None, mode: str = "prefix",
                               on_text: Callable[[str], None] | None = None,
                               tables: list[str] | None = None) -> CheckedAnswer:
        """`HeadstartClient.complete_checked`, awaited."""
        request = complete_request(db, question, max_new_tokens, mode, tables, candidates)
        reader = AnswerReader(on_text)
        try:
            async for response in self.stub.Complete(request, metadata=self.metadata, timeout=self.timeout_s):
                if reader.take(response):
                    return reader.answer()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        raise reader.ended_early()

    async def typing(self, db: str = "", session_id: str = "", candidates: object = None) -> "AsyncTypingSession":
        session = AsyncTypingSession(self.stub, self.metadata, self.timeout_s, self.reconnect_timeout_s)
        session.candidates = candidates_request(candidates)
        await session.open(db, session_id)
        return session

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> "AsyncHeadstartClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _unary(self, method, request):
        try:
            return await method(request, metadata=self.metadata, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None


class AsyncTypingSession:
    """One `Type` stream; see `TypingSession` (the same reconnect: a broken
    stream is reopened by `next_event` or by a write, with the newest snapshot
    and a pending submit re-sent, answer tokens never delivered twice)."""

    def __init__(self, stub, metadata, timeout_s: float, reconnect_timeout_s: float = 30.0):
        self.timeout_s, self.reconnect_timeout_s = timeout_s, reconnect_timeout_s
        self.seq = 0
        self.progress: types_pb2.Progress | None = None
        self.errors: list[ApiError] = []
        self.num_reconnects = 0
        self._stub, self._metadata = stub, metadata
        self._call = None
        self._closing = False
        self._lock = asyncio.Lock()
        self._input: tuple[int, str] | None = None
        self._pending: tuple | None = None  # submit_request's args of a submit awaiting its result (or choice)
        self._forwarded = self._skip = 0
        self._result_out = self._skip_result = False  # its Result delivered (a Choice owed) / to skip
        self.candidates: types_pb2.CandidatesRequest | None = None  # a new session's (OpenStream)
        self._resume_id = self.session_id = self.db = ""

    async def open(self, db: str, session_id: str) -> None:
        self._resume_id, self.db = session_id, db
        try:
            ready = await self._open_stream()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        self.session_id, self.db = ready.session_id, ready.db

    async def input(self, text: str) -> int:
        self.seq += 1
        self._input = (self.seq, text)
        await self._write(headstart_pb2.TypeRequest(input=headstart_pb2.Input(seq=self.seq, text=text)))
        return self.seq

    async def submit(self, text: str, max_new_tokens: int | None = None,
                     on_text: Callable[[str], None] | None = None) -> types_pb2.Result:
        seq = await self.send_submit(text, max_new_tokens)
        while True:
            response = await self.next_event()
            kind = response.WhichOneof("kind")
            if kind == "tokens" and on_text:
                on_text(response.tokens.text)
            elif kind == "result":
                return response.result
            elif kind == "error" and response.error.seq in (seq, 0):
                raise ApiError(response.error.code, response.error.message, response.error.seq)

    async def submit_checked(self, text: str, candidates: object = None, max_new_tokens: int | None = None,
                             on_text: Callable[[str], None] | None = None) -> CheckedAnswer:
        """`TypingSession.submit_checked`, awaited."""
        seq = await self.send_submit(text, max_new_tokens, candidates)
        reader = AnswerReader(on_text)
        while True:
            response = await self.next_event()
            if response.WhichOneof("kind") == "error" and response.error.seq in (seq, 0):
                raise ApiError(response.error.code, response.error.message, response.error.seq)
            if reader.take(response):
                return reader.answer()

    async def send_submit(self, text: str, max_new_tokens: int | None = None, candidates: object = None) -> int:
        """Send a submit without waiting for it (read with `next_event`); returns its seq."""
        self.seq += 1
        self._pending, self._forwarded, self._skip = (self.seq, text, max_new_tokens, candidates), 0, 0
        self._result_out = self._skip_result = False
        await self._write(submit_request(*self._pending))
        return self.seq

    async def next_event(self) -> headstart_pb2.TypeResponse:
        while True:
            call = self._call
            try:
                item = await asyncio.wait_for(call.read(), self.timeout_s)
            except grpc.RpcError as exc:
                if self._closing or not is_transport_failure(exc):
                    raise from_rpc_error(exc) from None
                await self._reconnect(call)
                continue
            if item is grpc.aio.EOF:
                raise ApiError("UNAVAILABLE", "the Type stream ended")
            if self._skipped(item):
                continue
            if item.WhichOneof("kind") == "progress":
                self.progress = item.progress
            elif item.WhichOneof("kind") == "error":
                self.errors.append(ApiError(item.error.code, item.error.message, item.error.seq))
            return item

    async def close(self) -> None:
        self._closing = True
        try:
            await self._call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass

    def cancel(self) -> None:
        self._closing = True
        self._call.cancel()

    # -- the stream and its reconnects --------------------------------------

    async def _open_stream(self) -> headstart_pb2.Ready:
        call = self._stub.Type(metadata=self._metadata)
        self._call = call
        await call.write(headstart_pb2.TypeRequest(open=headstart_pb2.OpenStream(
            session_id=self._resume_id, db=self.db, candidates=self.candidates)))
        if self._input is not None:
            seq, text = self._input
            await call.write(headstart_pb2.TypeRequest(input=headstart_pb2.Input(seq=seq, text=text)))
        if self._pending is not None:
            self._skip, self._skip_result = self._forwarded, self._result_out
            await call.write(submit_request(*self._pending))
        first = await asyncio.wait_for(call.read(), self.timeout_s)
        if first is grpc.aio.EOF:
            raise ApiError("UNAVAILABLE", "the Type stream ended before ready")
        return first.ready

    async def _reconnect(self, broken) -> None:
        """Reopen the stream (unless another caller already did); raises ApiError when it cannot."""
        async with self._lock:
            if self._call is not broken:
                return
            deadline = time.monotonic() + self.reconnect_timeout_s
            delay = 0.05
            while True:
                try:
                    ready = await self._open_stream()
                    self.session_id, self.num_reconnects = ready.session_id, self.num_reconnects + 1
                    return
                except grpc.RpcError as exc:
                    if not is_transport_failure(exc):
                        raise from_rpc_error(exc) from None
                except ApiError:
                    pass
                if time.monotonic() > deadline:
                    raise ApiError("UNAVAILABLE", f"no gateway for {self.reconnect_timeout_s:g} s")
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    def _skipped(self, item: headstart_pb2.TypeResponse) -> bool:
        """Count answer tokens; True for those delivered before a reconnect (dropped)."""
        kind = item.WhichOneof("kind")
        if kind == "tokens" and self._pending is not None:
            n = len(item.tokens.token_ids)
            if self._skip > 0 and n:
                self._skip -= n
                return True
            self._forwarded += n
        elif kind == "result" and self._skip_result:  # delivered before the reconnect
            self._skip_result = False
            return True
        elif kind == "result" and self._pending is not None and item.result.num_candidates > 1:
            self._result_out = True  # its Choice is owed: a reconnect re-sends the submit for it
        elif kind in ("result", "choice") or (kind == "error" and self._pending is not None
                                              and item.error.seq == self._pending[0]):
            self._pending = None
        return False

    async def _write(self, request: headstart_pb2.TypeRequest) -> None:
        call = self._call
        try:
            await call.write(request)
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            if self._closing or (isinstance(exc, grpc.RpcError) and not is_transport_failure(exc)):
                if isinstance(exc, grpc.RpcError):
                    raise from_rpc_error(exc) from None
                raise ApiError("UNAVAILABLE", f"the Type stream is closed: {exc}") from None
            await self._reconnect(call)  # re-sends the newest snapshot / pending submit: this write's effect
