"""Locust user classes: the base every user shares, and the typists (WebSocket, gRPC).

Completion callers (gRPC, REST, OpenAI streaming, the open-loop client) are
in `loadtest.completers`, data users in `loadtest.data_users`.

Two kinds of figures, both written to `samples.jsonl` for our report:

- **requests**, which are also Locust request events (so Locust's CSV, its
  HTML and its "Aggregated" row hold only these): `open` (connect → the
  session is ready), `rejected` (connect → an admission refusal,
  RESOURCE_EXHAUSTED / 429: a success, refusing at once is the wanted
  overload behaviour), `answer` (asked → the complete answer; its
  `response_length` is the answer's output tokens; a failure or timeout of
  the answer is a failure of this event);
- **metrics** of those requests, which are not Locust events (a keystroke
  is not a request, and an answer's TTFT is not a second answer):
  `ttft` (asked → the first piece of answer text; `length` = tokens
  computed at submit where known), `itl` (the gaps between streamed
  pieces, one sample holding them all), `keystroke_rtt` (a snapshot sent →
  the first progress message covering its seq).

The request type (Locust's "Type" column) is the user class's `label`. A
request past `LoadSettings.timeout_s` fails with TimeoutError. Users spread
over the tenants (tokens) and databases in turn; keystrokes come from the
seeded `Typist` that the benchmarks use. Only the Locust process imports
this module (gevent patches the standard library on import).
"""

from __future__ import annotations

import itertools
import json
import random
import time

import gevent
import gevent.event
import grpc.experimental.gevent as grpc_gevent
from locust import User, between, events, task

# NOTE: gRPC's C core blocks its calling thread; without this a blocking read
# in one greenlet would stall every user of the process.
grpc_gevent.init_gevent()

from headstart.client import ApiError, HeadstartClient  # noqa: E402 (after init_gevent)
from headstart.typist import Typist  # noqa: E402
from loadtest.settings import LoadSettings  # noqa: E402
from loadtest.timing import AnswerClock  # noqa: E402

SETTINGS = LoadSettings.from_env()
# Refusals that are the wanted overload answer (a share is full, a data session's ingestion is
# behind: the client backs off), counted as `rejected`, not as failures.
REJECTION_CODES = ("RESOURCE_EXHAUSTED", "RATE_LIMITED", "INGESTION_BEHIND")
QUESTIONS_PER_DB = 50
_user_numbers = itertools.count()
_questions: dict[str, list[str]] = {}
_samples = open(SETTINGS.samples_path, "a", buffering=1) if SETTINGS.samples_path else None
_acked = open(SETTINGS.acked_path, "a", buffering=1) if SETTINGS.acked_path else None
_answers = open(SETTINGS.answers_path, "a", buffering=1) if SETTINGS.answers_path else None


def _write_sample(user: str, name: str, ms: float | None, length: int = 0, error: str | None = None,
                  kind: str = "request", values: list[float] | None = None, code: str | None = None) -> None:
    if _samples is not None:
        sample = {"t": time.time(), "user": user, "name": name, "ms": ms, "length": length, "error": error,
                  "kind": kind, "code": code}
        if values is not None:
            sample["values"] = [round(v, 3) for v in values]
        _samples.write(json.dumps(sample) + "\n")


@events.request.add_listener
def _record_request(request_type, name, response_time, response_length, exception=None, **_):
    """Every request event, exact, for our report (Locust's CSV rounds its percentiles); a failure's
    API code when it has one (loadtest/faults.py: every client error must be typed)."""
    _write_sample(request_type, name, response_time, response_length,
                  None if exception is None else type(exception).__name__, code=getattr(exception, "code", None))


def http_error(response) -> ApiError:
    """A REST failure as the API's typed error (its JSON `code`; the bare status when it has none)."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    code = body.get("code") if isinstance(body, dict) else None
    if code is None and isinstance(body, dict) and isinstance(body.get("error"), dict):  # the OpenAI shape
        code = body["error"].get("code")
    message = (body.get("message") if isinstance(body, dict) else None) or response.text or ""
    return ApiError(code or str(response.status_code), message[:200])


def record_acked(token: str | None, sid: str, seqs) -> None:
    """An acknowledged push, for the check that none of it was lost (runs with faults)."""
    if _acked is not None:
        _acked.write(json.dumps({"token": token or "", "sid": sid, "seqs": [int(s) for s in seqs]}) + "\n")


def record_answer(user: "HeadstartUser", typing: "_Typing") -> None:
    """A typed session's outcome (when it opened, was submitted, ended; its answer's token ids or its
    error code), for the check that sessions continue through a fault with the cold run's answer."""
    if _answers is not None:
        r = typing.result or {"error": "TIMEOUT"}
        _answers.write(json.dumps({"user": user.label, "token": user.token or "", "db": user.db,
                                   "question": typing.text, "opened_t": typing.opened_t,
                                   "submitted_t": typing.submitted_t, "ended_t": time.time(),
                                   "token_ids": r.get("token_ids", []), "error": r.get("error")}) + "\n")


def questions_of(db: str) -> list[str]:
    """Spider dev questions of `db`, in a seeded order (loaded once per process)."""
    if db not in _questions:
        from bench.common import spider_questions

        picked = spider_questions([db], QUESTIONS_PER_DB, SETTINGS.seed)
        _questions[db] = list(dict.fromkeys(q["question"] for q in picked))
    return _questions[db]


class HeadstartUser(User):
    """A user of one tenant and one database (both taken in turn)."""

    abstract = True
    label = "headstart"
    wait_time = between(0.5, 2.0)

    def on_start(self) -> None:
        self.number = next(_user_numbers)
        tokens = SETTINGS.tokens
        self.token = tokens[self.number % len(tokens)] if tokens else None
        self.db = SETTINGS.dbs[self.number % len(SETTINGS.dbs)]
        self.rng = random.Random(f"{SETTINGS.seed}:{self.number}")
        self.typist = Typist(SETTINGS.wpm, SETTINGS.typo_rate, SETTINGS.pause_s, seed=SETTINGS.seed + self.number)

    def question(self) -> str:
        return self.rng.choice(questions_of(self.db))

    def fire(self, name: str, started: float, length: int = 0, exception: BaseException | None = None,
             ms: float | None = None, label: str | None = None) -> None:
        """A request event (Locust's and ours)."""
        ms = (time.perf_counter() - started) * 1000.0 if ms is None else ms
        self.environment.events.request.fire(request_type=label or self.label, name=name, response_time=ms,
                                             response_length=length, exception=exception, context={})

    def record(self, name: str, ms: float | None, length: int = 0, values: list[float] | None = None,
               label: str | None = None) -> None:
        """A metric of a request: ours only, not a Locust event."""
        _write_sample(label or self.label, name, ms, length, kind="metric", values=values)

    def answered(self, clock: AnswerClock, output_tokens: int, computed: int = 0, ttft_ms: float | None = None,
                 label: str | None = None) -> None:
        """A complete answer: the `answer` request, its `ttft` and `itl` metrics
        (`ttft_ms` overrides the client's, for an answer that is not streamed)."""
        self.fire("answer", clock.started, length=output_tokens, ms=clock.total_ms, label=label)
        ttft = ttft_ms if ttft_ms is not None else clock.ttft_ms
        if ttft is not None:
            self.record("ttft", ttft, length=computed, label=label)
        if clock.itl_ms:
            self.record("itl", None, values=clock.itl_ms, label=label)

    def refused(self, code: str, started: float, message: str) -> None:
        """An open that did not succeed: admission (`rejected`) or a failure of `open`."""
        if code in REJECTION_CODES:
            self.fire("rejected", started)
        else:
            self.fire("open", started, exception=ApiError(code, message))


class _Typing:
    """One typed question's clocks, shared by the sending and the reading greenlet."""

    def __init__(self, user: HeadstartUser, submit_seq: int):
        self.user, self.submit_seq = user, submit_seq
        self.sent: dict[int, float] = {}
        self.clock: AnswerClock | None = None
        self.result: dict | None = None
        self.done = gevent.event.Event()
        self.opened_t, self.submitted_t, self.text = time.time(), None, ""

    def on_progress(self, seq: int) -> None:
        for s in [s for s in self.sent if s <= seq]:
            self.user.record("keystroke_rtt", (time.perf_counter() - self.sent.pop(s)) * 1000.0)

    def on_token(self) -> None:
        if self.clock is not None and self.result is None:
            self.clock.token()

    def finish(self, result: dict) -> None:
        if not self.done.is_set():  # the first outcome counts (a close after the result is not an error)
            if self.clock is not None:
                self.clock.end()
            self.result = result
            self.done.set()

    def report(self) -> None:
        """Fire the answer (or its failure) once the submit is answered or timed out."""
        self.clock = self.clock or AnswerClock()  # the stream broke before Enter: a failure at once
        answered = self.done.wait(SETTINGS.timeout_s)
        record_answer(self.user, self)
        if not answered:
            self.user.fire("answer", self.clock.started,
                           exception=TimeoutError(f"no result in {SETTINGS.timeout_s:g} s"))
            return
        r = self.result
        if r.get("error"):
            self.user.fire("answer", self.clock.started, exception=ApiError(r["error"], r.get("message", "")))
            return
        self.user.answered(self.clock, r["tokens"], computed=r["computed"])

    def replay(self, trace, send_input, send_submit) -> None:
        start, self.text = time.perf_counter(), trace.final_text
        for seq, event in enumerate(trace.events, 1):
            gevent.sleep(max(0.0, start + event.t - time.perf_counter()))
            self.sent[seq] = time.perf_counter()
            send_input(seq, event.text)
        gevent.sleep(max(0.0, start + trace.submit_t - time.perf_counter()))
        self.sent.clear()  # keystrokes the server never reported before Enter: not counted
        self.clock, self.submitted_t = AnswerClock(), time.time()
        send_submit(self.submit_seq, trace.final_text)


class WsTypist(HeadstartUser):
    """Types a question keystroke by keystroke over the WebSocket and presses Enter."""

    abstract = True
    label = "ws_typist"

    @task
    def type_question(self) -> None:
        from websockets.sync.client import connect

        trace = self.typist.trace(self.question())
        url = self.host.replace("http", "ws", 1).rstrip("/") + f"/v1/sessions/ws?db={self.db}"
        url += f"&token={self.token}" if self.token else ""
        started = time.perf_counter()
        try:
            ws = connect(url, open_timeout=SETTINGS.timeout_s, max_size=4 << 20)
            first = json.loads(ws.recv(timeout=SETTINGS.timeout_s))
        except Exception as exc:  # refused connection, handshake timeout
            self.fire("open", started, exception=exc)
            return
        with ws:
            if first["type"] != "ready":
                self.refused(first.get("code", "?"), started, first.get("message", ""))
                return
            self.fire("open", started)
            typing = _Typing(self, len(trace.events) + 1)
            reader = gevent.spawn(self._read, ws, typing)
            try:
                typing.replay(
                    trace,
                    lambda seq, text: ws.send(json.dumps({"type": "input", "seq": seq, "text": text})),
                    lambda seq, text: ws.send(json.dumps({"type": "submit", "seq": seq, "text": text,
                                                          "max_new_tokens": SETTINGS.max_new_tokens})))
                typing.report()
            finally:
                reader.kill()

    @staticmethod
    def _read(ws, typing: _Typing) -> None:
        try:
            WsTypist._read_messages(ws, typing)
        except Exception as exc:  # the connection broke: the submit fails now, not at its timeout
            typing.finish({"error": "UNAVAILABLE", "message": f"WebSocket: {exc!r}"})
        else:
            typing.finish({"error": "UNAVAILABLE", "message": "the WebSocket closed"})

    @staticmethod
    def _read_messages(ws, typing: _Typing) -> None:
        for raw in ws:
            m = json.loads(raw)
            kind = m["type"]
            if kind == "progress":
                typing.on_progress(m["seq"])
            elif kind == "token":
                typing.on_token()
            elif kind == "done" and m["seq"] == typing.submit_seq:
                typing.finish({"computed": m["computed_tokens_at_submit"], "tokens": len(m["token_ids"]),
                               "token_ids": list(m["token_ids"])})
            elif kind == "error" and (m.get("seq") == typing.submit_seq or (not m.get("seq") and typing.clock)):
                typing.finish({"error": m["code"], "message": m["message"]})


class GrpcUser(HeadstartUser):
    """A user with its own Python gRPC client of the gateway, open for the user's life."""

    abstract = True

    def on_start(self) -> None:
        super().on_start()
        self.client = HeadstartClient(SETTINGS.grpc_target, self.token, timeout_s=SETTINGS.timeout_s)

    def on_stop(self) -> None:
        self.client.close()


class GrpcTypist(GrpcUser):
    """Types a question over the public gRPC `Type` stream (the Python client)."""

    abstract = True
    label = "grpc_typist"

    @task
    def type_question(self) -> None:
        trace = self.typist.trace(self.question())
        started = time.perf_counter()
        try:
            session = self.client.typing(self.db)
        except ApiError as exc:
            self.refused(exc.code, started, exc.message)
            return
        self.fire("open", started)
        typing = _Typing(self, len(trace.events) + 1)
        reader = gevent.spawn(self._read, session, typing)
        try:
            typing.replay(trace, lambda seq, text: session.input(text),
                          lambda seq, text: session.send_submit(text, SETTINGS.max_new_tokens))
            typing.report()
        finally:
            session.close()
            reader.kill()

    @staticmethod
    def _read(session, typing: _Typing) -> None:
        while True:
            try:
                m = session.next_event(SETTINGS.timeout_s)
            except (ApiError, TimeoutError) as exc:
                typing.finish({"error": getattr(exc, "code", "TIMEOUT"), "message": str(exc)})
                return
            kind = m.WhichOneof("kind")
            if kind == "progress":
                typing.on_progress(m.progress.seq)
            elif kind == "tokens":
                if m.tokens.text:
                    typing.on_token()
            elif kind == "result" and m.result.seq == typing.submit_seq:
                typing.finish({"computed": m.result.computed_tokens_at_submit, "tokens": len(m.result.token_ids),
                               "token_ids": list(m.result.token_ids)})
            elif kind == "error" and (m.error.seq == typing.submit_seq or (not m.error.seq and typing.clock)):
                typing.finish({"error": m.error.code, "message": m.error.message})
