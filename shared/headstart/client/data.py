"""Data-session calls of the Python client (docs/api.md, "Data API"), sync and async.

    with HeadstartClient("localhost:50051", token="...") as client:
        sid = client.open_data("world_1").session_id
        client.push_rows(sid, [{"table": "city", "values": {"ID": 5000, "Name": "Oslo", ...}}])
        client.register_flash(sid, "How many cities are there?")
        answer = client.query_data(sid, "How many cities are there?")   # answer.source: flash | model
        with client.subscribe(sid) as events:                              # data_updated, flash_ready, ...
            for event in events: ...

A row is `{"table": name, "values": {column: int | float | str | None}}`.
`push_rows` sends them as one `PushRows` client stream in batches of
`batch_rows` (each batch one message, validated and logged in order) and
returns one ack for all of them; with a `push_id` a retried call adds no row
twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import grpc

from headstart.client.errors import ApiError, from_rpc_error
from headstart.v1 import headstart_pb2

DEFAULT_BATCH_ROWS = 64  # rows per PushRows message: well under the gateway's 16 KiB message limit


def cell(value) -> headstart_pb2.DataValue:
    """A Python cell (int, float, str or None) as a `DataValue`."""
    if value is None:
        return headstart_pb2.DataValue(null_value=True)
    if isinstance(value, bool):
        raise ApiError("INVALID_ARGUMENT", f"{value!r}: booleans are not accepted (int, float, str or null)")
    if isinstance(value, int):
        return headstart_pb2.DataValue(int_value=value)
    if isinstance(value, float):
        return headstart_pb2.DataValue(real_value=value)
    if isinstance(value, str):
        return headstart_pb2.DataValue(text_value=value)
    raise ApiError("INVALID_ARGUMENT", f"{type(value).__name__} values are not accepted (int, float, str or null)")


def data_row(row: dict) -> headstart_pb2.DataRow:
    """A row dict as the API's `DataRow`."""
    if not isinstance(row, dict):
        raise ApiError("INVALID_ARGUMENT", "a row is a dict {table, values}")
    return headstart_pb2.DataRow(table=row.get("table") or "",
                                 values={k: cell(v) for k, v in (row.get("values") or {}).items()})


def push_requests(session_id: str, rows: Iterable[dict], batch_rows: int,
                  push_id: str | None = None) -> list[headstart_pb2.PushRowsRequest]:
    """`rows` as PushRows messages of at most `batch_rows` rows each (converted up front: a bad
    value raises here, before anything is sent). With `push_id`, message `i` carries the push id
    `{push_id}#{i}`: the same call retried sends the same ids."""
    if push_id is not None and (not isinstance(push_id, str) or not push_id):
        raise ApiError("INVALID_ARGUMENT", "push_id must be a non-empty string")
    wire = [data_row(r) for r in rows]
    starts = range(0, len(wire), max(1, batch_rows))
    return [headstart_pb2.PushRowsRequest(session_id=session_id, rows=wire[start:start + batch_rows],
                                          push_id=f"{push_id}#{i}" if push_id else "")
            for i, start in enumerate(starts)]


def query_request(session_id: str, question: str, max_new_tokens: int | None,
                  execute: bool) -> headstart_pb2.QueryDataRequest:
    return headstart_pb2.QueryDataRequest(session_id=session_id, question=question,
                                          max_new_tokens=max_new_tokens or 0, execute=execute)


def answer_rows(answer: headstart_pb2.DataQueryAnswer) -> list[list]:
    """The rows of an answer's SQL on the session's data (decoded from `rows_json`)."""
    return json.loads(answer.rows_json) if answer.rows_json else []


def open_request(db: str, retention: str | None, retention_tokens: int | None,
                 buffer_rows: int | None) -> headstart_pb2.OpenDataRequest:
    return headstart_pb2.OpenDataRequest(db=db, retention=retention or "", retention_tokens=retention_tokens or 0,
                                         buffer_rows=buffer_rows or 0)


class DataMethods:
    """The data calls of `HeadstartClient` (needs `stub`, `metadata`, `timeout_s`, `_unary`)."""

    def open_data(self, db: str, retention: str | None = None, retention_tokens: int | None = None,
                  buffer_rows: int | None = None) -> headstart_pb2.OpenDataResponse:
        """A new data session of `db` (retention "rebuild" | "shift"; None: the engine's defaults)."""
        return self._unary(self.stub.OpenData, open_request(db, retention, retention_tokens, buffer_rows))

    def push_rows(self, session_id: str, rows: Iterable[dict], batch_rows: int = DEFAULT_BATCH_ROWS,
                  push_id: str | None = None) -> headstart_pb2.DataPushAck:
        """Push rows (one PushRows stream); the ack has their seqs and the rows dropped.

        Args:
            push_id: names this push (unique per session, up to 120 characters). Call again with
                the same rows and id after a timeout or UNAVAILABLE: the batches that were logged
                are answered with their earlier seqs (`replayed_pushes`), the others pushed, none
                twice (exactly once). Without it a retry may add rows twice (at least once).

        Raises:
            ApiError: INVALID_ARGUMENT naming the first bad row (batches before its own stay pushed).
        """
        requests = push_requests(session_id, rows, batch_rows, push_id)
        try:
            return self.stub.PushRows(iter(requests), metadata=self.metadata, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def query_data(self, session_id: str, question: str, max_new_tokens: int | None = None,
                   execute: bool = True) -> headstart_pb2.DataQueryAnswer:
        """Answer `question` on the session's data (`answer_rows(answer)`: its SQL's rows)."""
        return self._unary(self.stub.QueryData, query_request(session_id, question, max_new_tokens, execute))

    def describe_data(self, session_id: str) -> headstart_pb2.DataDescription:
        return self._unary(self.stub.DescribeData, headstart_pb2.DataSessionRef(session_id=session_id))

    def close_data(self, session_id: str) -> None:
        self._unary(self.stub.CloseData, headstart_pb2.DataSessionRef(session_id=session_id))

    def register_flash(self, session_id: str, question: str) -> headstart_pb2.FlashQuestion:
        return self._unary(self.stub.RegisterFlash,
                           headstart_pb2.RegisterFlashRequest(session_id=session_id, question=question))

    def list_flash(self, session_id: str) -> list[headstart_pb2.FlashQuestion]:
        return list(self._unary(self.stub.ListFlash, headstart_pb2.DataSessionRef(session_id=session_id)).questions)

    def delete_flash(self, session_id: str, question_id: str) -> None:
        self._unary(self.stub.DeleteFlash, headstart_pb2.DeleteFlashRequest(session_id=session_id, id=question_id))

    def subscribe(self, session_id: str, last_event_id: str = "") -> "DataSubscription":
        """The session's events after `last_event_id` (empty: from now on), as they happen.

        Returns once the gateway has subscribed (an event after that is never
        missed); iterate it for `DataEvent`s, `close()` it to stop. A refusal
        (NOT_FOUND, ...) raises ApiError from the iteration.
        """
        call = self.stub.Subscribe(headstart_pb2.SubscribeRequest(session_id=session_id, last_event_id=last_event_id),
                                   metadata=self.metadata)
        call.initial_metadata()  # the gateway sends it once "now" is fixed (or the call ended: raised below)
        return DataSubscription(call)


class DataSubscription:
    """A `Subscribe` stream: an iterator of `DataEvent`s until `close()` (or the session closes)."""

    def __init__(self, call):
        self._call = call

    def __iter__(self) -> "DataSubscription":
        return self

    def __next__(self) -> headstart_pb2.DataEvent:
        try:
            return next(self._call)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise from_rpc_error(exc) from None

    def close(self) -> None:
        self._call.cancel()

    def __enter__(self) -> "DataSubscription":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncDataMethods:
    """The data calls of `AsyncHeadstartClient`: `DataMethods`, awaited."""

    async def open_data(self, db: str, retention: str | None = None, retention_tokens: int | None = None,
                        buffer_rows: int | None = None) -> headstart_pb2.OpenDataResponse:
        return await self._unary(self.stub.OpenData, open_request(db, retention, retention_tokens, buffer_rows))

    async def push_rows(self, session_id: str, rows: Iterable[dict], batch_rows: int = DEFAULT_BATCH_ROWS,
                        push_id: str | None = None) -> headstart_pb2.DataPushAck:
        """`DataMethods.push_rows`, awaited (`push_id`: a retry adds nothing twice)."""
        requests = push_requests(session_id, rows, batch_rows, push_id)
        try:
            return await self.stub.PushRows(iter(requests), metadata=self.metadata, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    async def query_data(self, session_id: str, question: str, max_new_tokens: int | None = None,
                         execute: bool = True) -> headstart_pb2.DataQueryAnswer:
        return await self._unary(self.stub.QueryData, query_request(session_id, question, max_new_tokens, execute))

    async def describe_data(self, session_id: str) -> headstart_pb2.DataDescription:
        return await self._unary(self.stub.DescribeData, headstart_pb2.DataSessionRef(session_id=session_id))

    async def close_data(self, session_id: str) -> None:
        await self._unary(self.stub.CloseData, headstart_pb2.DataSessionRef(session_id=session_id))

    async def register_flash(self, session_id: str, question: str) -> headstart_pb2.FlashQuestion:
        return await self._unary(self.stub.RegisterFlash,
                                 headstart_pb2.RegisterFlashRequest(session_id=session_id, question=question))

    async def list_flash(self, session_id: str) -> list[headstart_pb2.FlashQuestion]:
        ref = headstart_pb2.DataSessionRef(session_id=session_id)
        return list((await self._unary(self.stub.ListFlash, ref)).questions)

    async def delete_flash(self, session_id: str, question_id: str) -> None:
        await self._unary(self.stub.DeleteFlash, headstart_pb2.DeleteFlashRequest(session_id=session_id,
                                                                                  id=question_id))

    async def subscribe(self, session_id: str, last_event_id: str = "") -> "AsyncDataSubscription":
        """`DataMethods.subscribe`, awaited: returns once the gateway has subscribed."""
        call = self.stub.Subscribe(headstart_pb2.SubscribeRequest(session_id=session_id, last_event_id=last_event_id),
                                   metadata=self.metadata)
        await call.initial_metadata()
        return AsyncDataSubscription(call)


class AsyncDataSubscription:
    """A `Subscribe` stream: an async iterator of `DataEvent`s until `close()`."""

    def __init__(self, call):
        self._call = call

    def __aiter__(self) -> "AsyncDataSubscription":
        return self

    async def __anext__(self) -> headstart_pb2.DataEvent:
        try:
            event = await self._call.read()
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise StopAsyncIteration from None
            raise from_rpc_error(exc) from None
        if event is grpc.aio.EOF:
            raise StopAsyncIteration
        return event

    def close(self) -> None:
        self._call.cancel()
