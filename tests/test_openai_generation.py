"""Integration: the OpenAI API's generation parameters and typing sessions, with
the official SDK on the real serving stack (random:tiny float64): `stop` applied
exactly (the stop text never sent), `n` choices, `seed` (absent: random),
penalties, `ignore_eos`/`min_tokens`, and a typing session named on a chat
completion answering from its cache (`cached_tokens` = the whole prompt)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from headstart.client import HeadstartClient
from tests.serve_fixture import SERVED_MODEL
from tests.serve_helpers import MAX_NEW, recv, recv_until, ws_connect
from tests.typing_traces import QUESTIONS

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
QUESTION = QUESTIONS[2]
WORLD = {"database": "world_1"}
LONG = 24


@pytest.fixture(scope="module")
def cold(tiny_runtime):
    """The greedy answer (random weights never end early: LONG tokens)."""
    return tiny_runtime.complete("world_1", QUESTION, "cold", LONG)


@pytest.fixture(scope="module")
def api(serve_stack) -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{serve_stack.http_url}/v1", api_key="tok-alice", max_retries=0, timeout=120)


def _chat(api, **kwargs):
    kwargs.setdefault("max_tokens", LONG)
    extra = {**WORLD, **kwargs.pop("extra_body", {})}
    return api.chat.completions.create(model=SERVED_MODEL, messages=[{"role": "user", "content": QUESTION}],
                                       extra_body=extra, **kwargs)


def _stop_of(text: str) -> tuple[str, int]:
    """A stop string from the middle of `text`, and where it first starts."""
    stop = text[len(text) // 2: len(text) // 2 + 3]
    return stop, text.find(stop)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_ends_the_answer_before_the_stop_text(api, cold, stream):
    stop, at = _stop_of(cold.text)
    if stream:
        chunks = list(_chat(api, stop=[stop, "\x00never"], stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        used = chunks[-1].usage.completion_tokens
    else:
        reply = _chat(api, stop=stop)
        text, finish, used = reply.choices[0].message.content, [reply.choices[0].finish_reason], \
            reply.usage.completion_tokens
    assert text == cold.text[:at] and stop not in text
    assert finish == ["stop"] and 0 < used < LONG


def test_n_choices_are_distinct_samples_and_a_seed_repeats_them(api):
    first = _chat(api, n=3, temperature=1.0, seed=5, max_tokens=MAX_NEW)
    again = _chat(api, n=3, temperature=1.0, seed=5, max_tokens=MAX_NEW)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len(set(texts)) == 3 and texts == [c.message.content for c in again.choices]
    assert first.usage.completion_tokens == 3 * MAX_NEW and first.usage.prompt_tokens == again.usage.prompt_tokens


def test_n_choices_stream_each_with_its_finish(api):
    chunks = list(_chat(api, n=2, temperature=1.0, seed=9, max_tokens=MAX_NEW, stream=True,
                        stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    finishes = []
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes.append((choice.index, choice.finish_reason))
    assert sorted(finishes) == [(0, "length"), (1, "length")]
    replay = _chat(api, n=2, temperature=1.0, seed=9, max_tokens=MAX_NEW)
    assert [texts[0], texts[1]] == [c.message.content for c in replay.choices]
    assert chunks[-1].usage.completion_tokens == 2 * MAX_NEW


def test_no_seed_samples_afresh(api):
    texts = {_chat(api, temperature=1.0, max_tokens=MAX_NEW).choices[0].message.content for _ in range(3)}
    assert len(texts) == 3  # with seed 0 for all, these were one text


def test_penalties_change_the_answer_and_neutral_values_do_not(api, cold):
    for params in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                   {"extra_body": {"repetition_penalty": 3.0}}):
        reply = _chat(api, **params)
        assert reply.choices[0].message.content != cold.text, params
    neutral = _chat(api, presence_penalty=0.0, frequency_penalty=0.0, extra_body={"repetition_penalty": 1.0,
                                                                                   "top_k": -1})
    assert neutral.choices[0].message.content == cold.text


def test_ignore_eos_and_min_tokens_are_taken(api, cold):
    reply = _chat(api, extra_body={"ignore_eos": True, "min_tokens": LONG})
    assert reply.choices[0].message.content == cold.text and reply.usage.completion_tokens == LONG


def test_a_typing_session_answers_from_its_cache(serve_stack, api, cold):
    """Typed over gRPC, answered over the OpenAI API: the whole prompt was cached at submit."""
    with HeadstartClient(serve_stack.grpc_target, "tok-alice") as grpc_client:
        with grpc_client.typing("world_1") as typing:
            for end in range(5, len(QUESTION), 7):
                typing.input(QUESTION[:end])
            typing.input(QUESTION)
            progress = typing.wait_caught_up(60)
            assert progress.cached_tokens == progress.prompt_tokens
            reply = _chat(api, extra_body={"session": typing.session_id})
            seen = [typing.next_event(30) for _ in range(3)]
    usage, extra = reply.usage, reply.model_extra["headstart"]
    assert reply.choices[0].message.content == cold.text  # greedy: the cold answer, exactly
    assert usage.prompt_tokens == cold.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens  # the whole prompt was cached
    assert extra["computed_tokens_at_submit"] == 0
    assert any(e.WhichOneof("kind") in ("tokens", "result") for e in seen)  # the session's stream saw it too


def test_session_answer_streams_and_the_session_types_on(serve_stack, api, cold):
    """A REST-opened session, typed over the WebSocket: the completion streams
    its answer, and the session goes on (a second question)."""
    alice = {"authorization": "Bearer tok-alice"}
    sid = httpx.post(f"{serve_stack.http_url}/v1/sessions", json={"db": "world_1"}, headers=alice,
                     timeout=60).json()["session_id"]
    try:
        _answer_on_a_rest_session(serve_stack, api, cold, sid)
    finally:  # the stack is shared: give the tenant's session (and the replica's slot) back
        httpx.delete(f"{serve_stack.http_url}/v1/sessions/{sid}", headers=alice, timeout=60)


def _answer_on_a_rest_session(serve_stack, api, cold, sid: str) -> None:
    with ws_connect(serve_stack, session=sid) as ws:
        recv_until(ws, {"ready"})
        ws.send(json.dumps({"type": "input", "seq": 1, "text": QUESTION}))
        _wait_cached(ws, 1)
        chunks = list(_chat(api, stream=True, extra_body={"session": sid}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == cold.text
        done, _ = recv_until(ws, {"done"})  # the session's connection saw the same answer
        assert done["text"] == cold.text
        again = _chat(api, max_tokens=MAX_NEW, extra_body={"session": sid})
        assert again.choices[0].message.content == cold.text[:len(again.choices[0].message.content)]
    with pytest.raises(openai.BadRequestError) as info:
        _chat(api, n=2, extra_body={"session": sid})
    assert info.value.param == "n"
    with pytest.raises(openai.NotFoundError):
        _chat(api, extra_body={"session": "no-such-session"})


def _wait_cached(ws, seq: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = recv(ws, end - time.monotonic())
        if m["type"] == "progress" and m["seq"] >= seq and m["cached_tokens"] == m["prompt_tokens"]:
            return
    raise AssertionError("the session never cached its prompt")


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_name_each_token_and_its_top_alternatives(api, cold, stream):
    if stream:
        chunks = list(_chat(api, max_tokens=MAX_NEW, logprobs=True, top_logprobs=3, stream=True,
                            stream_options={"include_usage": True}))
        entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        reply = _chat(api, max_tokens=MAX_NEW, logprobs=True, top_logprobs=3)
        entries, text = reply.choices[0].logprobs.content, reply.choices[0].message.content
    assert text == cold.text[:len(text)] and len(entries) == MAX_NEW  # the same answer, one entry a token
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)  # greedy: the top one
        assert e.bytes == list(e.token.encode())


def test_text_completion_logprobs_in_the_text_apis_shape(api, cold):
    reply = api.completions.create(model=SERVED_MODEL, prompt=QUESTION, max_tokens=MAX_NEW, logprobs=2,
                                   extra_body=WORLD)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == MAX_NEW
    assert all(len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    assert reply.choices[0].text == cold.text[:len(reply.choices[0].text)]
