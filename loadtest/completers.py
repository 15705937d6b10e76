"""Locust users that ask a whole question at once (no typing): gRPC `Complete`,
REST `/v1/complete`, OpenAI streaming chat completions (closed loop), and the
open-loop client, which sends OpenAI requests at a fixed or Poisson rate
whatever the answers' pace, with question/answer lengths from length sets.

Each answer is one `answer` request event with its `ttft` and `itl` metrics
(`loadtest.users`), all measured at the client except REST's TTFT (its
answer is not streamed: the engine's TTFT).
"""

from __future__ import annotations

import itertools
import json
import time

import gevent
import gevent.pool
import requests
from locust import between, constant, task
from requests.adapters import HTTPAdapter

from headstart.client import ApiError
from loadtest.timing import AnswerClock, QuestionMaker, arrival_times, parse_length_sets
from loadtest.users import REJECTION_CODES, SETTINGS, GrpcUser, HeadstartUser, http_error, questions_of


class GrpcCompleter(GrpcUser):
    """Asks a whole question at once: `Complete` over gRPC, answer streamed."""

    abstract = True
    label = "grpc_complete"
    wait_time = between(1.0, 3.0)

    @task
    def complete(self) -> None:
        clock = AnswerClock()
        try:
            result = self.client.complete(self.db, self.question(), SETTINGS.max_new_tokens,
                                          on_text=lambda text: text and clock.token())
        except ApiError as exc:
            if exc.code in REJECTION_CODES:
                self.fire("rejected", clock.started)
            else:
                self.fire("answer", clock.started, exception=TimeoutError(exc.message)
                          if exc.code == "DEADLINE_EXCEEDED" else exc)
            return
        clock.end()
        self.answered(clock, len(result.token_ids), computed=result.computed_tokens_at_submit)


class HttpUser(HeadstartUser):
    """A user with a `requests` session carrying its bearer token."""

    abstract = True
    pool_size = 10

    def on_start(self) -> None:
        super().on_start()
        self.http = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=self.pool_size)
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)
        if self.token:
            self.http.headers["Authorization"] = f"Bearer {self.token}"

    def on_stop(self) -> None:
        self.http.close()


class RestCompleter(HttpUser):
    """`POST /v1/complete`: the answer comes whole, so its TTFT is the engine's."""

    abstract = True
    label = "rest_complete"
    wait_time = between(1.0, 3.0)

    @task
    def complete(self) -> None:
        clock = AnswerClock()
        body = {"db": self.db, "question": self.question(), "max_new_tokens": SETTINGS.max_new_tokens}
        try:
            response = self.http.post(self.host.rstrip("/") + "/v1/complete", json=body, timeout=SETTINGS.timeout_s)
        except requests.Timeout as exc:
            self.fire("answer", clock.started, exception=TimeoutError(str(exc)))
            return
        except requests.RequestException as exc:
            self.fire("answer", clock.started, exception=exc)
            return
        if response.status_code == 429:
            self.fire("rejected", clock.started)
            return
        if response.status_code != 200:
            self.fire("answer", clock.started, exception=http_error(response))
            return
        clock.end()
        data = response.json()
        # NOTE: REST's answer does not say how much was computed at submit: length 0
        self.answered(clock, len(data["token_ids"]), ttft_ms=data["ttft_ms"])


_models: dict[str, str] = {}


class OpenAIUser(HttpUser):
    """A client of the OpenAI-compatible API: streamed chat completions, timed at the client."""

    abstract = True

    def model(self) -> str:
        """The served model's id, as `GET /v1/models` lists it (once per process)."""
        if self.host not in _models:
            response = self.http.get(self.host.rstrip("/") + "/v1/models", timeout=SETTINGS.timeout_s)
            response.raise_for_status()
            _models[self.host] = response.json()["data"][0]["id"]
        return _models[self.host]

    def stream_chat(self, question: str, max_tokens: int, ignore_eos: bool = False,
                    label: str | None = None, token: str | None = None) -> None:
        """One streamed chat completion (as tenant `token`, else the user's); fires
        `answer` (or `rejected`) with its metrics."""
        clock = AnswerClock()
        body = {"model": self.model(), "database": self.db, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": question}]}
        if ignore_eos:
            body["ignore_eos"] = True
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            with self.http.post(self.host.rstrip("/") + "/v1/chat/completions", json=body, stream=True,
                                headers=headers, timeout=SETTINGS.timeout_s) as response:
                if response.status_code == 429:
                    self.fire("rejected", clock.started, label=label)
                    return
                if response.status_code != 200:
                    raise http_error(response)
                tokens, computed = self._read_stream(response, clock)
        except requests.Timeout as exc:
            self.fire("answer", clock.started, exception=TimeoutError(str(exc)), label=label)
            return
        except (requests.RequestException, ApiError, ValueError) as exc:
            self.fire("answer", clock.started, exception=exc, label=label)
            return
        clock.end()
        self.answered(clock, tokens, computed=computed, label=label)

    @staticmethod
    def _read_stream(response, clock: AnswerClock) -> tuple[int, int]:
        """Mark each piece of text; (output tokens, tokens computed at submit) from the usage chunk."""
        tokens = computed = 0
        for line in response.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise ApiError(str(chunk["error"].get("code")), chunk["error"].get("message", ""))
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                clock.token()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
                computed = (chunk.get("headstart") or {}).get("computed_tokens_at_submit", 0)
        return tokens, computed


class OpenAIStreamer(OpenAIUser):
    """Closed loop: asks a Spider question, reads the streamed answer, waits, asks again."""

    abstract = True
    label = "openai_stream"
    wait_time = between(1.0, 3.0)

    @task
    def ask(self) -> None:
        self.stream_chat(self.question(), SETTINGS.max_new_tokens)


class OpenLoopClient(OpenAIUser):
    """Open loop: requests arrive at `SETTINGS.rate` per second (fixed gaps or a
    Poisson process), each sent when it arrives whatever the answers' pace
    (at most `max_in_flight` at once: past it an arrival fails as
    `ClientOverloaded`, it is not queued). Each takes the next length set
    `IN:OUT` in turn: a question of IN tokens (real Spider questions, cut),
    an answer of exactly OUT tokens (`ignore_eos`). Each length set is a
    user class of its own in the report: `open_loop IN:OUT`."""

    abstract = True
    label = "open_loop"
    wait_time = constant(0)
    fixed_count = 1

    def on_start(self) -> None:
        self.pool_size = SETTINGS.max_in_flight
        super().on_start()
        self.lengths = itertools.cycle(parse_length_sets(SETTINGS.length_sets))
        self.tokens = itertools.cycle(SETTINGS.tokens or [None])
        self.maker = _question_maker(self.db)

    @task
    def arrivals(self) -> None:
        pool = gevent.pool.Pool(SETTINGS.max_in_flight)
        start = time.perf_counter()
        for at in arrival_times(SETTINGS.rate, SETTINGS.arrival, SETTINGS.seed):
            gevent.sleep(max(0.0, start + at - time.perf_counter()))
            in_tokens, out_tokens = next(self.lengths)
            label = f"open_loop {in_tokens}:{out_tokens}"
            if pool.full():
                self.fire("answer", time.perf_counter(), label=label,
                          exception=ClientOverloaded(f"{SETTINGS.max_in_flight} requests in flight"))
                continue
            pool.spawn(self.stream_chat, self.maker.question(in_tokens), out_tokens, True, label, next(self.tokens))


class ClientOverloaded(Exception):
    """The open-loop client had `max_in_flight` requests waiting: the server fell behind the arrival rate."""


def _question_maker(db: str) -> QuestionMaker:
    from tokenizers import Tokenizer

    from headstart.paths import default_tokenizer_dir

    tokenizer = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    return QuestionMaker(questions_of(db), lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
                         tokenizer.decode, SETTINGS.seed)
