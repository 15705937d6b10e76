"""Integration: the official `openai` SDK against the gateway's OpenAI-compatible
endpoints, on the real serving stack (Ray Serve, 2 replicas, random:tiny float64).

The answers are the engine's Complete: the same tokens as a cold run.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serve_helpers import MAX_NEW
from tests.typing_traces import QUESTIONS

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
QUESTION = QUESTIONS[1]


@pytest.fixture(scope="module")
def cold(tiny_runtime):
    return tiny_runtime.complete("world_1", QUESTION, "cold", MAX_NEW)


def client(stack, token: str = "tok-alice") -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key=token, max_retries=0, timeout=120)


def test_models_are_the_databases(serve_stack):
    ids = [m.id for m in client(serve_stack).models.list()]
    assert "headstart/world_1" in ids and "headstart/concert_singer" in ids
    assert all(i.startswith("headstart/") for i in ids)
    model = client(serve_stack, "tok-bob").models.retrieve("headstart/world_1")
    assert (model.id, model.owned_by) == ("headstart/world_1", "headstart")
    assert httpx.get(f"{serve_stack.http_url}/health", timeout=30).json() == {"status": "ok"}  # vLLM's route


def test_chat_completion_matches_cold_with_usage(serve_stack, cold):
    response = client(serve_stack).chat.completions.create(
        model="headstart/world_1", max_tokens=MAX_NEW,
        messages=[{"role": "system", "content": "ignored: the database's prompt is used"},
                  {"role": "user", "content": "an earlier question"},
                  {"role": "assistant", "content": "SELECT 1"},
                  {"role": "user", "content": QUESTION}])
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == cold.text
    assert choice.finish_reason == "length"
    usage = response.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (cold.prompt_tokens, MAX_NEW)
    assert usage.total_tokens == cold.prompt_tokens + MAX_NEW
    # prefix mode: everything before the question comes from the warm prompt cache
    assert 0 < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens
    assert response.model == "headstart/world_1" and response.id.startswith("chatcmpl-")


def test_chat_stream_matches_the_whole_answer(serve_stack, cold):
    stream = client(serve_stack, "tok-bob").chat.completions.create(
        model="world_1", max_completion_tokens=MAX_NEW, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == cold.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == MAX_NEW
    assert usage.prompt_tokens == cold.prompt_tokens and usage.prompt_tokens_details.cached_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_text_completion_prompt_is_the_question(serve_stack, cold, stream):
    api = client(serve_stack)
    if stream:
        chunks = list(api.completions.create(model="headstart/world_1", prompt=QUESTION, max_tokens=MAX_NEW,
                                             stream=True))
        text = "".join(c.choices[0].text for c in chunks)
        assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
        assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk
    else:
        response = api.completions.create(model="world_1", prompt=[QUESTION], max_tokens=MAX_NEW)
        text = response.choices[0].text
        assert response.usage.completion_tokens == MAX_NEW and response.object == "text_completion"
    assert text == cold.text


def test_raw_sse_ends_with_done(serve_stack):
    with httpx.stream("POST", f"{serve_stack.http_url}/v1/chat/completions", timeout=120,
                      headers={"authorization": "Bearer tok-alice"},
                      json={"model": "headstart/world_1", "max_tokens": 3, "stream": True,
                            "messages": [{"role": "user", "content": QUESTION}]}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


ERRORS = [
    # name, token, request changes, SDK exception, status, code, param
    ("unknown model", "tok-alice", {"model": "headstart/no_such_db"}, "NotFoundError", 404, "model_not_found", "model"),
    ("bad token", "wrong", {}, "AuthenticationError", 401, "invalid_api_key", None),
    ("n above 1", "tok-alice", {"n": 2}, "BadRequestError", 400, "invalid_value", "n"),
    ("zero max_tokens", "tok-alice", {"max_tokens": 0}, "BadRequestError", 400, "invalid_value", "max_tokens"),
    ("max_tokens above the limit", "tok-alice", {"max_tokens": 100_000}, "BadRequestError", 400, "invalid_value",
     "max_tokens"),
    ("temperature out of range", "tok-alice", {"temperature": 7}, "BadRequestError", 400, "invalid_value",
     "temperature"),
    ("stop sequences", "tok-alice", {"stop": ["\n"]}, "BadRequestError", 400, "invalid_value", "stop"),
    ("logprobs", "tok-alice", {"logprobs": True}, "BadRequestError", 400, "invalid_value", "logprobs"),
    ("no user message", "tok-alice", {"messages": [{"role": "system", "content": "x"}]}, "BadRequestError", 400,
     "invalid_value", "messages"),
    ("question too long", "tok-alice", {"messages": [{"role": "user", "content": "x" * 5000}]},
     "BadRequestError", 413, "context_length_exceeded", "messages"),
    ("image content", "tok-alice", {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                               "image_url": {"url": "x"}}]}]},
     "BadRequestError", 400, "invalid_value", "messages[0].content"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("token", "changes", "exc_name", "status", "code", "param"),
                         [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_in_openai_shape(serve_stack, token, changes, exc_name, status, code, param, stream):
    request = {"model": "headstart/world_1", "max_tokens": 4, "messages": [{"role": "user", "content": QUESTION}],
               "stream": stream, **changes}
    exc_type = getattr(openai, exc_name) if status != 413 else openai.APIStatusError
    with pytest.raises(exc_type) as info:
        client(serve_stack, token).chat.completions.create(**request)
    assert info.value.status_code == status
    assert (info.value.code, info.value.param, info.value.type) == (
        code, param, "authentication_error" if status == 401 else "invalid_request_error")
    # the stack is unharmed: the next request works
    ok = client(serve_stack).chat.completions.create(model="headstart/world_1", max_tokens=2,
                                                    messages=[{"role": "user", "content": QUESTION}])
    assert ok.usage.completion_tokens == 2


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b'{"model": "headstart/world_1", "prompt": 42}', 400, "invalid_value"),
    (b'{"model": 7, "prompt": "How many?"}', 400, "invalid_value"),
    (b'{"model": "headstart/world_1", "prompt": "' + b"x" * 20_000 + b'"}', 413, "message_too_large"),
])
def test_malformed_bodies(serve_stack, body, status, code):
    response = httpx.post(f"{serve_stack.http_url}/v1/completions", content=body, timeout=60,
                          headers={"authorization": "Bearer tok-alice", "content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and set(error) == {"message", "type", "code", "param"}


def test_models_need_a_token(serve_stack):
    with pytest.raises(openai.AuthenticationError):
        client(serve_stack, "nope").models.list()
    with pytest.raises(openai.NotFoundError):
        client(serve_stack).models.retrieve("headstart/no_such_db")
