"""Blocking client: unary calls and a typing session over the `Type` stream."""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import grpc

from headstart.client.checked import CheckedAnswer, candidates_request
from headstart.client.data import DataMethods
from headstart.client.errors import ApiError, from_rpc_error, is_transport_failure
from headstart.v1 import headstart_pb2, headstart_pb2_grpc, types_pb2

_STOP = object()
_END = object()


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def submit_request(seq: int, text: str, max_new_tokens: int | None,
                   candidates: object = None) -> headstart_pb2.TypeRequest:
    params = types_pb2.SamplingParams(max_new_tokens=max_new_tokens or 0)
    return headstart_pb2.TypeRequest(submit=headstart_pb2.Submit(seq=seq, text=text, params=params,
                                                                 candidates=candidates_request(candidates)))


def complete_request(db: str, question: str, max_new_tokens: int | None, mode: str,
                     tables: list[str] | None, candidates: object = None) -> headstart_pb2.CompleteRequest:
    params = types_pb2.SamplingParams(max_new_tokens=max_new_tokens or 0)
    return headstart_pb2.CompleteRequest(db=db, question=question, params=params, mode=mode, tables=tables or [],
                                         candidates=candidates_request(candidates))


class AnswerReader:
    """Collects one answer's messages: its Result, then its Choice when the Result says one follows."""

    def __init__(self, on_text: Callable[[str], None] | None = None):
        self.on_text, self.result, self.choice = on_text, None, None

    def take(self, response) -> bool:
        """One `Complete`/`Type` message; True once the answer is whole."""
        kind = response.WhichOneof("kind")
        if kind == "tokens" and self.on_text:
            self.on_text(response.tokens.text)
        elif kind == "result":
            self.result = response.result
        elif kind == "choice":
            self.choice = response.choice
        return self.result is not None and (self.result.num_candidates < 2 or self.choice is not None)

    def ended_early(self) -> ApiError:
        """The error of a stream that ended before its result (or its owed choice)."""
        return ApiError("INTERNAL", "the stream ended without a result" if self.result is None
                        else "the stream ended without the checked choice")

    def answer(self) -> CheckedAnswer:
        return CheckedAnswer(self.result, self.choice)


def complete_result(response: headstart_pb2.CompleteResponse,
                    on_text: Callable[[str], None] | None) -> types_pb2.Result | None:
    """One `Complete` stream message: text goes to `on_text`; the result is returned."""
    kind = response.WhichOneof("kind")
    if kind == "tokens" and on_text:
        on_text(response.tokens.text)
    return response.result if kind == "result" else None


class HeadstartClient(DataMethods):
    """A connection to a gateway's public gRPC port (data sessions: `headstart.client.data`)."""

    def __init__(self, target: str, token: str | None = None, timeout_s: float = 120.0,
                 reconnect_timeout_s: float = 30.0):
        self.channel = grpc.insecure_channel(target)
        self.stub = headstart_pb2_grpc.HeadstartStub(self.channel)
        self.metadata = auth_metadata(token)
        self.timeout_s = timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s  # how long a typing session tries to get its stream back

    def list_databases(self) -> list[headstart_pb2.Database]:
        return list(self._unary(self.stub.ListDatabases, headstart_pb2.ListDatabasesRequest()).databases)

    def open_session(self, db: str) -> str:
        """A session that lives until `close_session` (attach with `typing(session_id=...)`)."""
        return self._unary(self.stub.OpenSession, headstart_pb2.OpenSessionRequest(db=db)).session_id

    def close_session(self, session_id: str) -> None:
        self._unary(self.stub.CloseSession, headstart_pb2.CloseSessionRequest(session_id=session_id))

    def complete(self, db: str, question: str, max_new_tokens: int | None = None, mode: str = "prefix",
                 on_text: Callable[[str], None] | None = None,
                 tables: list[str] | None = None) -> types_pb2.Result:
        """One completion with no typing; `on_text` sees the text as it streams.

        `tables` prompts with only those tables of `db`, in that order (None:
        the whole schema); a name the database lacks raises ApiError
        INVALID_ARGUMENT.
        """
        request = complete_request(db, question, max_new_tokens, mode, tables)
        try:
            for response in self.stub.Complete(request, metadata=self.metadata, timeout=self.timeout_s):
                if (result := complete_result(response, on_text)) is not None:
                    return result
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        raise ApiError("INTERNAL", "the stream ended without a result")

    def complete_checked(self, db: str, question: str, candidates: object = None,
                         max_new_tokens: int | None = None, mode: str = "prefix",
                         on_text: Callable[[str], None] | None = None,
                         tables: list[str] | None = None) -> CheckedAnswer:
        """A completion with `candidates` (headstart.client.checked): the greedy Result and,
        when k > 1, the execution-checked Choice with its rows."""
        request = complete_request(db, question, max_new_tokens, mode, tables, candidates)
        reader = AnswerReader(on_text)
        try:
            for response in self.stub.Complete(request, metadata=self.metadata, timeout=self.timeout_s):
                if reader.take(response):
                    return reader.answer()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        raise reader.ended_early()

    def typing(self, db: str = "", session_id: str = "", candidates: object = None) -> "TypingSession":
        """Open a `Type` stream: on a new session for `db` (whose pauses decode `candidates`;
        None: the server's default), or on an open session."""
        return TypingSession(self.stub, self.metadata, db, session_id, self.timeout_s, self.reconnect_timeout_s,
                             candidates)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "HeadstartClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _unary(self, method, request):
        try:
            return method(request, metadata=self.metadata, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None


class TypingSession:
    """One `Type` stream. `input` sends a snapshot (seq assigned here), `submit`
    blocks until the result; progress is kept in `progress` as it arrives.

    Reconnect: when the stream breaks under it (the gateway restarted, the
    connection dropped; not when the server refuses something), the session
    opens a new stream by itself within `reconnect_timeout_s` and re-sends its
    newest snapshot, and a submit still waiting for its result: the gateway
    rebuilds the session from that text (snapshots are full texts, so nothing
    typed is lost). Answer tokens already delivered are not delivered twice
    (greedy decoding of the same prompt gives the same tokens). A session
    opened from `db` gets a new `session_id`; one opened by id resumes that id
    (NOT_FOUND when the gateway forgot it). `num_reconnects` counts them.
    """

    def __init__(self, stub, metadata, db: str, session_id: str, timeout_s: float, reconnect_timeout_s: float = 30.0,
                 candidates: object = None):
        self.timeout_s, self.reconnect_timeout_s = timeout_s, reconnect_timeout_s
        self.candidates = candidates_request(candidates)  # the new session's (OpenStream)
        self.seq = 0
        self.progress: types_pb2.Progress | None = None
        self.errors: list[ApiError] = []
        self.num_reconnects = 0
        self._stub, self._metadata, self._resume_id = stub, metadata, session_id
        self._lock = threading.Lock()
        self._closing = False
        self._input: tuple[int, str] | None = None  # the newest snapshot: what a reconnect re-sends
        self._pending: tuple | None = None  # a submit awaiting its result (or its choice): submit_request's args
        self._forwarded = self._skip = 0  # answer tokens delivered / to skip after a re-submit
        self._result_out = self._skip_result = False  # its Result delivered (a Choice owed) / to skip
        self._events: queue.Queue = queue.Queue()
        self.db = db
        try:
            ready = self._open_stream()
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        self.session_id, self.db = ready.session_id, ready.db
        threading.Thread(target=self._read, daemon=True, name="headstart-type-reader").start()

    def input(self, text: str) -> int:
        with self._lock:
            self.seq += 1
            self._input = (self.seq, text)
            self._requests.put(headstart_pb2.TypeRequest(input=headstart_pb2.Input(seq=self.seq, text=text)))
            return self.seq

    def submit(self, text: str, max_new_tokens: int | None = None,
               on_text: Callable[[str], None] | None = None) -> types_pb2.Result:
        """Send the final text and wait for its Result; raises ApiError for its error."""
        seq = self.send_submit(text, max_new_tokens)
        while True:
            response = self.next_event(self.timeout_s)
            kind = response.WhichOneof("kind")
            if kind == "tokens" and on_text:
                on_text(response.tokens.text)
            elif kind == "result":
                return response.result
            elif kind == "error" and response.error.seq in (seq, 0):
                raise ApiError(response.error.code, response.error.message, response.error.seq)

    def submit_checked(self, text: str, candidates: object = None, max_new_tokens: int | None = None,
                       on_text: Callable[[str], None] | None = None) -> CheckedAnswer:
        """Send the final text with `candidates` (None: the session's) and wait for its Result and,
        when it decoded candidates, its Choice; raises ApiError for its error."""
        seq = self.send_submit(text, max_new_tokens, candidates)
        reader = AnswerReader(on_text)
        while True:
            response = self.next_event(self.timeout_s)
            if response.WhichOneof("kind") == "error" and response.error.seq in (seq, 0):
                raise ApiError(response.error.code, response.error.message, response.error.seq)
            if reader.take(response):
                return reader.answer()

    def send_submit(self, text: str, max_new_tokens: int | None = None, candidates: object = None) -> int:
        """Send a submit without waiting (read its messages with `next_event`); returns its seq."""
        with self._lock:
            self.seq += 1
            self._pending, self._forwarded, self._skip = (self.seq, text, max_new_tokens, candidates), 0, 0
            self._result_out = self._skip_result = False
            self._requests.put(submit_request(*self._pending))
            return self.seq

    def wait_caught_up(self, timeout_s: float = 30.0) -> types_pb2.Progress:
        """Block until a progress message says the cache holds the whole prompt of the last input."""
        end = time.monotonic() + timeout_s
        while not (self.progress and self.progress.seq == self.seq
                   and self.progress.cached_tokens == self.progress.prompt_tokens):
            self.next_event(max(0.0, end - time.monotonic()))
        return self.progress

    def next_event(self, timeout_s: float | None = None) -> headstart_pb2.TypeResponse:
        """The next message (progress is also recorded); raises ApiError when the stream failed."""
        try:
            item = self._events.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no message from the server in {timeout_s} s") from None
        if item is _END:
            self._events.put(_END)
            raise ApiError("UNAVAILABLE", "the Type stream ended")
        if isinstance(item, ApiError):
            self._events.put(_END)
            raise item
        if item.WhichOneof("kind") == "progress":
            self.progress = item.progress
        elif item.WhichOneof("kind") == "error":
            self.errors.append(ApiError(item.error.code, item.error.message, item.error.seq))
        return item

    def close(self) -> None:
        """Half-close; the server ends the stream (and an ephemeral session)."""
        with self._lock:
            self._closing = True
            self._requests.put(_STOP)

    def cancel(self) -> None:
        self._closing = True
        self._call.cancel()

    def __enter__(self) -> "TypingSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the stream and its reconnects --------------------------------------

    def _open_stream(self) -> headstart_pb2.Ready:
        """A new `Type` call: open, then the newest snapshot and a pending submit; returns Ready."""
        with self._lock:
            requests: queue.Queue = queue.Queue()
            requests.put(headstart_pb2.TypeRequest(open=headstart_pb2.OpenStream(
                session_id=self._resume_id, db=self.db, candidates=self.candidates)))
            if self._input is not None:
                seq, text = self._input
                requests.put(headstart_pb2.TypeRequest(input=headstart_pb2.Input(seq=seq, text=text)))
            if self._pending is not None:
                requests.put(submit_request(*self._pending))
                self._skip, self._skip_result = self._forwarded, self._result_out
            self._requests = requests
            self._call = self._stub.Type(iter(requests.get, _STOP), metadata=self._metadata)
            call = self._call
        try:
            return next(call).ready
        except StopIteration:
            raise ApiError("UNAVAILABLE", "the Type stream ended before ready") from None

    def _read(self) -> None:
        try:
            while True:
                try:
                    for response in self._call:
                        self._on_response(response)
                    return  # the server ended the stream (after our half-close)
                except grpc.RpcError as exc:
                    if self._closing or not is_transport_failure(exc):
                        if exc.code() != grpc.StatusCode.CANCELLED:
                            self._events.put(from_rpc_error(exc))
                        return
                if not self._reconnect():
                    return
        finally:
            self._events.put(_END)

    def _reconnect(self) -> bool:
        deadline = time.monotonic() + self.reconnect_timeout_s
        delay = 0.05
        while not self._closing:
            try:
                ready = self._open_stream()
                self.session_id, self.num_reconnects = ready.session_id, self.num_reconnects + 1
                return True
            except grpc.RpcError as exc:
                if not is_transport_failure(exc):
                    self._events.put(from_rpc_error(exc))
                    return False
            except ApiError:
                pass
            if time.monotonic() > deadline:
                self._events.put(ApiError("UNAVAILABLE", f"no gateway for {self.reconnect_timeout_s:g} s"))
                return False
            time.sleep(delay)
            delay = min(1.0, delay * 2)
        return False

    def _on_response(self, response: headstart_pb2.TypeResponse) -> None:
        kind = response.WhichOneof("kind")
        with self._lock:
            pending = self._pending
            if kind == "tokens" and pending is not None:
                n = len(response.tokens.token_ids)
                if self._skip > 0 and n:  # delivered before the reconnect
                    self._skip -= n
                    return
                self._forwarded += n
            elif kind == "result" and self._skip_result:  # delivered before the reconnect
                self._skip_result = False
                return
            elif kind == "result" and pending is not None and response.result.num_candidates > 1:
                self._result_out = True  # its Choice is owed: a reconnect re-sends the submit for it
            elif kind in ("result", "choice") or (kind == "error" and pending is not None
                                                  and response.error.seq == pending[0]):
                self._pending = None
        self._events.put(response)
