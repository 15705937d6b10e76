"""Simulated typists for `bench/serve.py`: one over the WebSocket, one over gRPC.

A typist replays a `Typist` trace in real time. Anticipatory: every keystroke
is sent as a snapshot. Baseline (`anticipate=False`): nothing is sent while
typing, so at submit the session holds only the schema prefix, which is what
prefix caching gives. TTFT is measured at the client: submit sent → first
token received. With candidates (K > 1) the session decodes them during the
pauses, the submit asks them (`wait_all`: the choice among all K, not only
those ready when the greedy answer ends), and the checked answer's time is
submit sent → `choice` received.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass

from headstart.client import ApiError, AsyncHeadstartClient
from headstart.trace import Trace
from headstart.v1 import types_pb2


@dataclass
class Sample:
    path: str  # "ws" | "grpc"
    anticipate: bool
    question: str
    ttft_ms: float | None = None  # client-observed
    engine_ttft_ms: float | None = None
    total_ms: float | None = None
    client_total_ms: float | None = None  # client-observed: submit sent → last token received
    prompt_tokens: int = 0
    cached_tokens_at_submit: int = 0
    computed_tokens_at_submit: int = 0
    answer_tokens_at_submit: int | None = None  # decoded ahead, streamed at once (sessions only)
    answer_tokens: int | None = None  # the whole answer's tokens (it ends at EOS or the cap)
    text: str = ""  # the whole answer: the same question must get the same text in every mode of ours
    error: str = ""
    # with candidates: submit sent -> the checked answer (`choice`) received, and what it was
    checked_client_total_ms: float | None = None
    checked_num_candidates: int | None = None  # candidates checked (without wait_all: those ready)
    checked_agreed: int | None = None
    checked_changed: bool | None = None  # the check kept another SQL than the greedy one's
    checked_sql: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


async def _sleep_until(start: float, t: float) -> None:
    delay = start + t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _checked(sample: Sample, sent: float, choice: dict) -> None:
    """Record a checked answer (a `choice` message as JSON) received now."""
    sample.checked_client_total_ms = (time.perf_counter() - sent) * 1000.0
    sample.checked_num_candidates, sample.checked_agreed = choice["num_candidates"], choice["agreed"]
    sample.checked_changed, sample.checked_sql = choice["index"] != 0, choice["sql"]


def _submit_candidates(candidates: int, wait_all: bool) -> int | dict:
    """A submit's `candidates`: the count, or with `wait_all` the object form that asks for all K."""
    return {"k": candidates, "wait_all": True} if wait_all and candidates > 1 else candidates


async def ws_typist(ws_url: str, token: str | None, db: str, trace: Trace, anticipate: bool, max_new: int,
                    candidates: int = 1, wait_all: bool = False) -> Sample:
    from websockets.asyncio.client import connect

    sample = Sample("ws", anticipate, trace.final_text)
    url = f"{ws_url}/v1/sessions/ws?db={db}" + (f"&token={token}" if token else "") + \
        (f"&candidates={candidates}" if candidates > 1 else "")
    async with connect(url, max_size=4 << 20, open_timeout=60) as ws:
        ready = json.loads(await ws.recv())
        if ready["type"] != "ready":
            sample.error = ready.get("code", "?")
            return sample
        loop = asyncio.get_running_loop()
        done, checked = loop.create_future(), loop.create_future()
        first: list[float] = []

        async def read() -> None:
            async for raw in ws:
                message = json.loads(raw)
                if message["type"] == "token" and not first:
                    first.append(time.perf_counter())
                elif message["type"] in ("done", "error") and message.get("seq") == submit_seq and not done.done():
                    done.set_result(message)
                elif message["type"] == "choice" and message.get("seq") == submit_seq:
                    _checked(sample, sent, message)
                    checked.set_result(message)

        submit_seq = len(trace.events) + 1
        reader = asyncio.create_task(read())
        start = time.perf_counter()
        for seq, event in enumerate(trace.events, 1):
            await _sleep_until(start, event.t)
            if anticipate:
                await ws.send(json.dumps({"type": "input", "seq": seq, "text": event.text}))
        await _sleep_until(start, trace.submit_t)
        sent = time.perf_counter()
        await ws.send(json.dumps({"type": "submit", "seq": submit_seq, "text": trace.final_text,
                                  "max_new_tokens": max_new,
                                  "candidates": _submit_candidates(candidates, wait_all)}))
        message = await asyncio.wait_for(done, 300)
        sample.client_total_ms = (time.perf_counter() - sent) * 1000.0
        if message["type"] == "done" and message.get("num_candidates", 0) > 1:
            await asyncio.wait_for(checked, 300)
        reader.cancel()
    if message["type"] == "error":
        sample.error = message["code"]
        return sample
    sample.ttft_ms = ((first[0] if first else time.perf_counter()) - sent) * 1000.0
    sample.engine_ttft_ms, sample.total_ms = message["ttft_ms"], message["total_ms"]
    sample.prompt_tokens = message["prompt_tokens"]
    sample.cached_tokens_at_submit = message["cached_tokens_at_submit"]
    sample.computed_tokens_at_submit = message["computed_tokens_at_submit"]
    sample.answer_tokens_at_submit = message.get("answer_tokens_at_submit")
    sample.text, sample.answer_tokens = message.get("text", ""), len(message.get("token_ids") or [])
    return sample


async def grpc_typist(target: str, token: str | None, db: str, trace: Trace, anticipate: bool, max_new: int,
                      candidates: int = 1, wait_all: bool = False) -> Sample:
    sample = Sample("grpc", anticipate, trace.final_text)
    client = AsyncHeadstartClient(target, token, timeout_s=300)
    first: list[float] = []
    submit_seq = len(trace.events) + 1

    async def read(session) -> types_pb2.Result:
        # Reads all along, as the WebSocket typist does, so progress messages never queue up.
        result = None
        while True:
            response = await session.next_event()
            kind = response.WhichOneof("kind")
            if kind == "tokens" and not first:
                first.append(time.perf_counter())
            elif kind == "result":
                result = response.result
                sample.client_total_ms = (time.perf_counter() - sent) * 1000.0
                if result.num_candidates < 2:
                    return result
            elif kind == "choice" and result is not None:
                c = response.choice
                _checked(sample, sent, {"num_candidates": c.num_candidates, "agreed": c.agreed, "index": c.index,
                                        "sql": c.sql})
                return result
            elif kind == "error" and response.error.seq == submit_seq:
                raise ApiError(response.error.code, response.error.message)

    sent = 0.0
    try:
        session = await client.typing(db, candidates=candidates if candidates > 1 else None)
        reader = asyncio.create_task(read(session))
        start = time.perf_counter()
        for event in trace.events:
            await _sleep_until(start, event.t)
            if anticipate:
                await session.input(event.text)
            else:
                session.seq += 1  # same seqs as the anticipatory run
        await _sleep_until(start, trace.submit_t)
        sent = time.perf_counter()
        await session.send_submit(trace.final_text, max_new, _submit_candidates(candidates, wait_all))
        result = await reader
        await session.close()
    except ApiError as exc:
        sample.error = exc.code
        return sample
    finally:
        await client.close()
    sample.ttft_ms = ((first[0] if first else time.perf_counter()) - sent) * 1000.0
    sample.engine_ttft_ms, sample.total_ms = result.ttft_ms, result.total_ms
    sample.prompt_tokens = result.prompt_tokens
    sample.cached_tokens_at_submit = result.cached_tokens_at_submit
    sample.computed_tokens_at_submit = result.computed_tokens_at_submit
    sample.answer_tokens_at_submit = result.answer_tokens_at_submit
    sample.text, sample.answer_tokens = result.text, len(result.token_ids)
    return sample
