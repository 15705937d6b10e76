"""asyncio client: the same API as `sync.py` on `grpc.aio`."""

from __future__ import annotations

import asyncio
from typing import Callable

import grpc

from headstart.client.errors import ApiError, from_rpc_error
from headstart.client.sync import auth_metadata, complete_request, complete_result, submit_request
from headstart.v1 import headstart_pb2, headstart_pb2_grpc, types_pb2


class AsyncHeadstartClient:
    """A connection to a gateway's public gRPC port (create it inside a running loop)."""

    def __init__(self, target: str, token: str | None = None, timeout_s: float = 120.0):
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = headstart_pb2_grpc.HeadstartStub(self.channel)
        self.metadata = auth_metadata(token)
        self.timeout_s = timeout_s

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

    async def typing(self, db: str = "", session_id: str = "") -> "AsyncTypingSession":
        session = AsyncTypingSession(self.stub, self.metadata, self.timeout_s)
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
    """One `Type` stream; see `TypingSession`."""

    def __init__(self, stub, metadata, timeout_s: float):
        self.timeout_s = timeout_s
        self.seq = 0
        self.progress: types_pb2.Progress | None = None
        self.errors: list[ApiError] = []
        self._call = stub.Type(metadata=metadata)
        self.session_id = self.db = ""

    async def open(self, db: str, session_id: str) -> None:
        await self._write(headstart_pb2.TypeRequest(open=headstart_pb2.OpenStream(session_id=session_id, db=db)))
        ready = (await self.next_event()).ready
        self.session_id, self.db = ready.session_id, ready.db

    async def input(self, text: str) -> int:
        self.seq += 1
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

    async def send_submit(self, text: str, max_new_tokens: int | None = None) -> int:
        """Send a submit without waiting for it (read with `next_event`); returns its seq."""
        self.seq += 1
        await self._write(submit_request(self.seq, text, max_new_tokens))
        return self.seq

    async def next_event(self) -> headstart_pb2.TypeResponse:
        try:
            item = await asyncio.wait_for(self._call.read(), self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        if item is grpc.aio.EOF:
            raise ApiError("UNAVAILABLE", "the Type stream ended")
        if item.WhichOneof("kind") == "progress":
            self.progress = item.progress
        elif item.WhichOneof("kind") == "error":
            self.errors.append(ApiError(item.error.code, item.error.message, item.error.seq))
        return item

    async def close(self) -> None:
        try:
            await self._call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass

    def cancel(self) -> None:
        self._call.cancel()

    async def _write(self, request: headstart_pb2.TypeRequest) -> None:
        try:
            await self._call.write(request)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
