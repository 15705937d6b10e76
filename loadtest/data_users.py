"""Locust data users: a data session of their own each, rows pushed into it.

- `DataProducer` (REST) and `GrpcDataProducer` (OpenData, a PushRows stream per
  push) push `data_rows_per_push` rows every `data_push_interval_s`:
  requests `open`, `push` (the push's round trip, length = rows).
- `FlashSubscriber` registers a question (`register`), subscribes to the
  session's SSE events (`subscribe`; a failure when the stream broke, and is
  resumed from its last event id) and pushes every `flash_push_interval_s`;
  its metrics `data_updated` and `flash_ready` are a push's ack → the event
  of a data version holding its rows (a version is the seq of the newest
  ingested row, so one event completes every push it covers, each from its
  own ack).
"""

from __future__ import annotations

import time

import gevent
import gevent.event
import requests
from locust import constant_pacing, task

from headstart.client import ApiError, HeadstartClient
from loadtest.data import PushClock, RowTemplate, SseParser
from loadtest.users import REJECTION_CODES, SETTINGS, HeadstartUser, http_error, record_acked


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
        if response.status_code == 429 or (response.status_code == 503 and "Retry-After" in response.headers):
            self.fire("rejected", started)  # a full share, or a data session's ingestion behind (INGESTION_BEHIND)
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
            for acked in clock.expired(deadline):  # a lost event: a failure the report counts
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
            self.record(kind, (now - acked) * 1000.0, length=int(payload.get("version", 0)))


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
