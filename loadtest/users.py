"""Locust user classes: typists over WebSocket and gRPC, completion callers over
gRPC and REST, data producers and flash subscribers over REST + SSE.

Every figure a user watches is a Locust request event whose `request_type` is
the user class's `label` and whose `name` is the figure:

- `open`: connect → the session is ready (a failure if it is refused for any
  reason but admission).
- `rejected`: connect → the admission refusal (RESOURCE_EXHAUSTED / 429);
  a success: refusing at once is the wanted overload behaviour.
- `keystroke_rtt`: a snapshot sent → the first progress message whose seq
  covers it (the server has folded that keystroke into the session's cache).
- `ttft`: submit sent → the first answer token (REST: the engine's TTFT, the
  response is not streamed); `response_length` = tokens computed at submit.
- `last_token`: submit sent → the result.

Data users (`DataProducer`, `FlashSubscriber`: their own data session each):

- `open`: POST /v1/data → the session is open.
- `push`: POST /v1/data/{sid}/rows → its ack; `response_length` = rows pushed.
- `register`, `subscribe` (flash subscriber): the question registered; the SSE stream
  answered (a failure: it broke, and is resumed from its last event id).
- `data_updated`: a push's ack → the SSE `data_updated` of a version holding its rows.
- `flash_ready`: a push's ack → the SSE `flash_ready` of an answer at a version holding
  its rows (the flash worker re-answered the registered question on that data).

A request past `LoadSettings.timeout_s` fails with TimeoutError. Users spread
over the tenants (tokens) and databases in turn; keystrokes come from the
seeded `Typist` that the benchmarks use. Only the Locust process imports this
module (gevent patches the standard library on import).
"""

from __future__ import annotations

import itertools
import json
import random
import time

import gevent
import gevent.event
import grpc.experimental.gevent as grpc_gevent
import requests
from locust import User, between, constant_pacing, events, task

# NOTE: gRPC's C core blocks its calling thread; without this a blocking read
# in one greenlet would stall every user of the process.
grpc_gevent.init_gevent()

from headstart.client import ApiError, HeadstartClient  # noqa: E402 (after init_gevent)
from headstart.typist import Typist  # noqa: E402
from loadtest.data import PushClock, RowTemplate, SseParser  # noqa: E402
from loadtest.settings import LoadSettings  # noqa: E402

SETTINGS = LoadSettings.from_env()
REJECTION_CODES = ("RESOURCE_EXHAUSTED", "RATE_LIMITED")
QUESTIONS_PER_DB = 50
_user_numbers = itertools.count()
_questions: dict[str, list[str]] = {}
_samples = open(SETTINGS.samples_path, "a", buffering=1) if SETTINGS.samples_path else None
_acked = open(SETTINGS.acked_path, "a", buffering=1) if SETTINGS.acked_path else None


@events.request.add_listener
def _record_sample(request_type, name, response_time, response_length, exception=None, **_):
    """Every event, exact, for our report (Locust's CSV rounds its percentiles); a failure's API code
    when it has one (loadtest/faults.py: every client error must be typed)."""
    if _samples is not None:
        _samples.write(json.dumps({"t": time.time(), "user": request_type, "name": name, "ms": response_time,
                                   "length": response_length,
                                   "error": None if exception is None else type(exception).__name__,
                                   "code": getattr(exception, "code", None)}) + "\n")


def http_error(response) -> ApiError:
    """A REST failure as the API's typed error (its JSON `code`; the bare status when it has none)."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    code = body.get("code") if isinstance(body, dict) else None
    return ApiError(code or str(response.status_code), (body.get("message") if code else response.text or "")[:200])


def record_acked(token: str | None, sid: str, seqs) -> None:
    """An acknowledged push, for the check that none of it was lost (runs with faults)."""
    if _acked is not None:
        _acked.write(json.dumps({"token": token or "", "sid": sid, "seqs": [int(s) for s in seqs]}) + "\n")


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
             ms: float | None = None) -> None:
        ms = (time.perf_counter() - started) * 1000.0 if ms is None else ms
        self.environment.events.request.fire(request_type=self.label, name=name, response_time=ms,
                                             response_length=length, exception=exception, context={})

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
        self.submitted = 0.0
        self.first_token = 0.0
        self.result: dict | None = None
        self.done = gevent.event.Event()

    def on_progress(self, seq: int) -> None:
        for s in [s for s in self.sent if s <= seq]:
            self.user.fire("keystroke_rtt", self.sent.pop(s))

    def on_token(self) -> None:
        if self.submitted and not self.first_token:
            self.first_token = time.perf_counter()

    def finish(self, result: dict) -> None:
        if not self.done.is_set():  # the first outcome counts (a close after the result is not an error)
            self.result = result
            self.done.set()

    def report(self) -> None:
        """Fire ttft and last_token (or their failure) once the submit is answered or timed out."""
        if not self.done.wait(SETTINGS.timeout_s):
            self.user.fire("ttft", self.submitted, exception=TimeoutError(f"no result in {SETTINGS.timeout_s:g} s"))
            return
        r = self.result
        if r.get("error"):
            self.user.fire("ttft", self.submitted, exception=ApiError(r["error"], r.get("message", "")))
            return
        first = self.first_token or time.perf_counter()
        self.user.fire("ttft", self.submitted, length=r["computed"], ms=(first - self.submitted) * 1000.0)
        self.user.fire("last_token", self.submitted, length=r["computed"])

    def replay(self, trace, send_input, send_submit) -> None:
        start = time.perf_counter()
        for seq, event in enumerate(trace.events, 1):
            gevent.sleep(max(0.0, start + event.t - time.perf_counter()))
            self.sent[seq] = time.perf_counter()
            send_input(seq, event.text)
        gevent.sleep(max(0.0, start + trace.submit_t - time.perf_counter()))
        self.sent.clear()  # keystrokes the server never reported before Enter: not counted
        self.submitted = time.perf_counter()
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
                typing.finish({"computed": m["computed_tokens_at_submit"]})
            elif kind == "error" and (m.get("seq") == typing.submit_seq or (not m.get("seq") and typing.submitted)):
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
                typing.on_token()
            elif kind == "result" and m.result.seq == typing.submit_seq:
                typing.finish({"computed": m.result.computed_tokens_at_submit})
            elif kind == "error" and (m.error.seq == typing.submit_seq or (not m.error.seq and typing.submitted)):
                typing.finish({"error": m.error.code, "message": m.error.message})


class GrpcCompleter(GrpcUser):
    """Asks a whole question at once: `Complete` over gRPC, answer streamed."""

    abstract = True
    label = "grpc_complete"
    wait_time = between(1.0, 3.0)

    @task
    def complete(self) -> None:
        first: list[float] = []
        started = time.perf_counter()
        try:
            result = self.client.complete(self.db, self.question(), SETTINGS.max_new_tokens,
                                          on_text=lambda _: first or first.append(time.perf_counter()))
        except ApiError as exc:
            if exc.code in REJECTION_CODES:
                self.fire("rejected", started)
            else:
                self.fire("ttft", started, exception=TimeoutError(exc.message) if exc.code == "DEADLINE_EXCEEDED"
                          else exc)
            return
        computed = result.computed_tokens_at_submit
        self.fire("ttft", started, length=computed, ms=((first[0] if first else time.perf_counter()) - started) * 1e3)
        self.fire("last_token", started, length=computed)


class RestCompleter(HeadstartUser):
    """`POST /v1/complete`: the answer comes whole, so `ttft` is the engine's."""

    abstract = True
    label = "rest_complete"
    wait_time = between(1.0, 3.0)

    def on_start(self) -> None:
        super().on_start()
        self.http = requests.Session()
        if self.token:
            self.http.headers["Authorization"] = f"Bearer {self.token}"

    def on_stop(self) -> None:
        self.http.close()

    @task
    def complete(self) -> None:
        started = time.perf_counter()
        body = {"db": self.db, "question": self.question(), "max_new_tokens": SETTINGS.max_new_tokens}
        try:
            response = self.http.post(self.host.rstrip("/") + "/v1/complete", json=body, timeout=SETTINGS.timeout_s)
        except requests.Timeout as exc:
            self.fire("last_token", started, exception=TimeoutError(str(exc)))
            return
        except requests.RequestException as exc:
            self.fire("last_token", started, exception=exc)
            return
        if response.status_code == 429:
            self.fire("rejected", started)
            return
        if response.status_code != 200:
            self.fire("last_token", started, exception=http_error(response))
            return
        data = response.json()
        # NOTE: REST's answer does not say how much was computed at submit: length 0, shown as "-"
        self.fire("last_token", started)
        self.fire("ttft", started, ms=data["ttft_ms"])


class DataUser(HeadstartUser):
    """A data session of its own on `SETTINGS.data_db` over REST, rows from `SETTINGS.data_row`."""

    abstract = True

    def on_start(self) -> None:
        super().on_start()
        self.http = requests.Session()
        if self.token:
            self.http.headers["Authorization"] = f"Bearer {self.token}"
        self.url = self.host.rstrip("/")
        self.rows = RowTemplate(SETTINGS.data_row, seed=f"{SETTINGS.seed}:{self.number}")
        self.sid: str | None = None

    def on_stop(self) -> None:
        if self.sid and not SETTINGS.acked_path:  # with faults, the command checks the rows, then closes it
            try:
                self.http.delete(f"{self.url}/v1/data/{self.sid}", timeout=SETTINGS.timeout_s)
            except requests.RequestException:
                pass  # the run is ending: an unclosed session is the gateway's to expire
        self.http.close()

    def call(self, name: str, method: str, path: str, body: dict | None = None) -> tuple[dict | None, float]:
        """One REST call; fires `name` on failure (a 429 fires `rejected`), returns (JSON, end time) or (None, _)."""
        started = time.perf_counter()
        try:
            response = self.http.request(method, self.url + path, json=body, timeout=SETTINGS.timeout_s)
        except requests.Timeout as exc:
            self.fire(name, started, exception=TimeoutError(str(exc)))
            return None, 0.0
        except requests.RequestException as exc:
            self.fire(name, started, exception=exc)
            return None, 0.0
        ended = time.perf_counter()
        if response.status_code == 429:
            self.fire("rejected", started)
            return None, ended
        if response.status_code != 200:
            self.fire(name, started, exception=http_error(response))
            return None, ended
        return response.json(), ended

    def open(self) -> bool:
        started = time.perf_counter()
        opened, _ = self.call("open", "POST", "/v1/data", {"db": SETTINGS.data_db})
        if opened is None:
            return False
        self.fire("open", started)
        self.sid = opened["session_id"]
        return True

    def push(self) -> tuple[int, float] | None:
        """Push `data_rows_per_push` rows; (the newest row's seq, ack time), or None when it failed."""
        rows = self.rows.rows(SETTINGS.data_rows_per_push)
        started = time.perf_counter()
        ack, ended = self.call("push", "POST", f"/v1/data/{self.sid}/rows", {"rows": rows})
        if ack is None:
            return None
        self.fire("push", started, length=len(rows), ms=(ended - started) * 1000.0)
        record_acked(self.token, self.sid, ack["seqs"])
        return max(ack["seqs"]), ended


class DataProducer(DataUser):
    """Pushes rows at a steady rate (a push every `data_push_interval_s`, whatever its round trip)."""

    abstract = True
    label = "data_producer"
    wait_time = constant_pacing(SETTINGS.data_push_interval_s)

    @task
    def push_rows(self) -> None:
        if self.sid is None and not self.open():
            return
        self.push()


class FlashSubscriber(DataUser):
    """Registers a flash question, subscribes to its session's SSE events and pushes rows
    now and then; times each push's ack to the `data_updated` and the `flash_ready` of its version."""

    abstract = True
    label = "flash_subscriber"
    wait_time = constant_pacing(SETTINGS.flash_push_interval_s)

    def on_start(self) -> None:
        super().on_start()
        self.clocks = {"data_updated": PushClock(), "flash_ready": PushClock()}
        self.subscribed = gevent.event.Event()
        self.reader = None
        self.response = None

    def on_stop(self) -> None:
        if self.reader is not None:
            self.reader.kill()
        if self.response is not None:
            self.response.close()
        super().on_stop()

    def start_session(self) -> bool:
        if not self.open():
            return False
        started = time.perf_counter()
        registered, _ = self.call("register", "POST", f"/v1/data/{self.sid}/flash",
                                  {"question": SETTINGS.flash_question})
        if registered is None:
            return False
        self.fire("register", started)
        self.reader = gevent.spawn(self._read_events, self.sid)
        if not self.subscribed.wait(SETTINGS.timeout_s):  # events from "now": subscribe before the first push
            self.fire("subscribe", started, exception=TimeoutError("the event stream did not open"))
            return False
        return True

    @task
    def push_and_time(self) -> None:
        if self.reader is None and not self.start_session():
            return
        pushed = self.push()
        if pushed is not None:
            for clock in self.clocks.values():
                clock.acked(*pushed)
        deadline = time.perf_counter() - SETTINGS.timeout_s
        for name, clock in self.clocks.items():
            for acked in clock.expired(deadline):
                self.fire(name, acked, exception=TimeoutError(f"no {name} in {SETTINGS.timeout_s:g} s"))

    def _read_events(self, sid: str) -> None:
        """The session's SSE stream for the user's life; a broken stream resumes from its last id."""
        parser = SseParser()
        while True:
            # resume after the last event seen (none yet: from the session's first), so no
            # event is lost while (re)connecting
            headers = {"Accept": "text/event-stream", "Last-Event-ID": parser.last_id or "0"}
            started = time.perf_counter()
            try:
                # NOTE: the read timeout only bounds a silent stream: the gateway sends a
                # keep-alive comment about every 15 s.
                self.response = self.http.get(f"{self.url}/v1/data/{sid}/events", headers=headers, stream=True,
                                              timeout=(SETTINGS.timeout_s, 60.0))
                if self.response.status_code != 200:
                    raise http_error(self.response)
                if not self.subscribed.is_set():
                    self.fire("subscribe", started)
                    self.subscribed.set()
                for line in self.response.iter_lines(chunk_size=None, decode_unicode=True):
                    event = parser.feed(line)
                    if event is not None:
                        self._on_event(event.kind, event.payload)
            except (requests.RequestException, ApiError) as exc:
                self.fire("subscribe", started, exception=exc)
            gevent.sleep(1.0)

    def _on_event(self, kind: str, payload: dict) -> None:
        if kind == "error":  # the stream's last event (Redis away: UNAVAILABLE); the loop resumes it
            self.fire("subscribe", time.perf_counter(), exception=ApiError(payload.get("code", "?"),
                                                                            payload.get("message", "")))
            return
        clock = self.clocks.get(kind)
        if clock is None:
            return  # rows_dropped: counted by the gateway's metrics and the push acks
        now = time.perf_counter()
        for acked in clock.reached(int(payload.get("version", 0))):
            self.fire(kind, acked, length=int(payload.get("version", 0)), ms=(now - acked) * 1000.0)


class GrpcDataProducer(DataProducer):
    """`DataProducer` over the public gRPC API: OpenData, then a PushRows client stream per push."""

    abstract = True
    label = "grpc_data_producer"

    def on_start(self) -> None:
        super().on_start()
        self.client = HeadstartClient(SETTINGS.grpc_target, self.token, timeout_s=SETTINGS.timeout_s)

    def on_stop(self) -> None:
        if self.sid and not SETTINGS.acked_path:  # with faults, the command checks the rows, then closes it
            try:
                self.client.close_data(self.sid)
            except ApiError:
                pass  # the run is ending: an unclosed session is the gateway's to expire
        self.sid = None
        self.client.close()
        super().on_stop()

    def open(self) -> bool:
        started = time.perf_counter()
        try:
            self.sid = self.client.open_data(SETTINGS.data_db).session_id
        except ApiError as exc:
            self.refused(exc.code, started, exc.message)
            return False
        self.fire("open", started)
        return True

    def push(self) -> tuple[int, float] | None:
        rows = self.rows.rows(SETTINGS.data_rows_per_push)
        started = time.perf_counter()
        try:
            ack = self.client.push_rows(self.sid, rows)
        except ApiError as exc:
            if exc.code in REJECTION_CODES:
                self.fire("rejected", started)
            else:
                self.fire("push", started, exception=TimeoutError(exc.message) if exc.code == "DEADLINE_EXCEEDED"
                          else exc)
            return None
        ended = time.perf_counter()
        self.fire("push", started, length=len(rows), ms=(ended - started) * 1000.0)
        record_acked(self.token, self.sid, ack.seqs)
        return max(ack.seqs), ended
