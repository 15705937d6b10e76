"""Integration: the official `openai` SDK against the gateway's OpenAI-compatible
endpoints, on the real serving stack (Ray Serve, 2 replicas, random:tiny float64):
model ids, databases, streaming, usage, errors in OpenAI's shape on every path,
request ids. (Generation parameters and typing sessions: test_openai_generation.py.)

The answers are the engine's Complete: the same tokens as a cold run.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serve_fixture import SERVED_MODEL
from tests.serve_helpers import MAX_NEW
from tests.typing_traces import QUESTIONS

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
QUESTION = QUESTIONS[1]
WORLD = {"database": "world_1"}


@pytest.fixture(scope="module")
def cold(tiny_runtime):
    return tiny_runtime.complete("world_1", QUESTION, "cold", MAX_NEW)


def client(stack, token: str = "tok-alice") -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key=token, max_retries=0, timeout=120)


def test_models_list_the_served_model(serve_stack):
    models = client(serve_stack).models.list().data
    assert [m.id for m in models] == [SERVED_MODEL]
    assert models[0].owned_by == "headstart"
    alias = client(serve_stack, "tok-bob").models.retrieve("headstart/world_1")  # kept: names model and database
    assert (alias.id, alias.model_extra["parent"]) == ("headstart/world_1", SERVED_MODEL)
    assert client(serve_stack).models.retrieve(SERVED_MODEL).id == SERVED_MODEL
    assert httpx.get(f"{serve_stack.http_url}/health", timeout=30).json() == {"status": "ok"}  # vLLM's route


def test_chat_completion_names_model_and_database(serve_stack, cold):
    response = client(serve_stack).chat.completions.create(
        model=SERVED_MODEL, max_tokens=MAX_NEW, extra_body=WORLD,
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
    assert response.model == SERVED_MODEL and response.id.startswith("chatcmpl-")


def test_alias_model_ids_still_name_the_database(serve_stack, cold):
    for model in ("headstart/world_1", "world_1"):
        reply = client(serve_stack).chat.completions.create(
            model=model, max_tokens=MAX_NEW, messages=[{"role": "user", "content": QUESTION}])
        assert reply.choices[0].message.content == cold.text and reply.model == model


def test_default_database_of_a_gateway(make_gateway, cold):
    stack = make_gateway(openai_database="world_1")
    reply = client(stack).completions.create(model=SERVED_MODEL, prompt=QUESTION, max_tokens=MAX_NEW)
    assert reply.choices[0].text == cold.text


def test_chat_stream_matches_the_whole_answer(serve_stack, cold):
    stream = client(serve_stack, "tok-bob").chat.completions.create(
        model=SERVED_MODEL, max_completion_tokens=MAX_NEW, stream=True, stream_options={"include_usage": True},
        extra_body=WORLD, messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
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
        chunks = list(api.completions.create(model=SERVED_MODEL, prompt=QUESTION, max_tokens=MAX_NEW,
                                             stream=True, extra_body=WORLD))
        text = "".join(c.choices[0].text for c in chunks)
        assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
        assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk
    else:
        response = api.completions.create(model=SERVED_MODEL, prompt=[QUESTION], max_tokens=MAX_NEW,
                                          extra_body=WORLD)
        text = response.choices[0].text
        assert response.usage.completion_tokens == MAX_NEW and response.object == "text_completion"
    assert text == cold.text


def test_raw_sse_ends_with_done_and_request_ids_go_both_ways(serve_stack):
    with httpx.stream("POST", f"{serve_stack.http_url}/v1/chat/completions", timeout=120,
                      headers={"authorization": "Bearer tok-alice", "x-request-id": "trace-42"},
                      json={"model": SERVED_MODEL, "database": "world_1", "max_tokens": 3, "stream": True,
                            "messages": [{"role": "user", "content": QUESTION}]}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-request-id"] == "trace-42"
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
    made = httpx.get(f"{serve_stack.http_url}/healthz", timeout=30).headers["x-request-id"]
    assert len(made) == 32 and made != "trace-42"  # none sent: the gateway makes one
    bad = httpx.get(f"{serve_stack.http_url}/healthz", headers={"x-request-id": "x" * 500}, timeout=30)
    assert bad.headers["x-request-id"] != "x" * 500  # too long to echo


ERRORS = [
    # name, token, request changes, SDK exception, status, code, param
    ("unknown model", "tok-alice", {"model": "no-such-model"}, "NotFoundError", 404, "model_not_found", "model"),
    ("unknown alias", "tok-alice", {"model": "headstart/no_such_db"}, "NotFoundError", 404, "model_not_found",
     "model"),
    ("unknown database", "tok-alice", {"extra_body": {"database": "no_such_db"}}, "NotFoundError", 404,
     "database_not_found", "database"),
    ("no database", "tok-alice", {"extra_body": {}}, "BadRequestError", 400, "invalid_value", "database"),
    ("alias and database disagree", "tok-alice", {"model": "headstart/pets_1"}, "BadRequestError", 400,
     "invalid_value", "database"),
    ("bad token", "wrong", {}, "AuthenticationError", 401, "invalid_api_key", None),
    ("n above the bound", "tok-alice", {"n": 5}, "BadRequestError", 400, "invalid_value", "n"),
    ("zero max_tokens", "tok-alice", {"max_tokens": 0}, "BadRequestError", 400, "invalid_value", "max_tokens"),
    ("max_tokens above the limit", "tok-alice", {"max_tokens": 100_000}, "BadRequestError", 400, "invalid_value",
     "max_tokens"),
    ("temperature out of range", "tok-alice", {"temperature": 7}, "BadRequestError", 400, "invalid_value",
     "temperature"),
    ("five stop strings", "tok-alice", {"stop": ["a", "b", "c", "d", "e"]}, "BadRequestError", 400,
     "invalid_value", "stop"),
    ("min_tokens above max_tokens", "tok-alice", {"extra_body": {"database": "world_1", "min_tokens": 9}},
     "BadRequestError", 400, "invalid_value", "min_tokens"),
    ("top_logprobs without logprobs", "tok-alice", {"top_logprobs": 2}, "BadRequestError", 400, "invalid_value",
     "top_logprobs"),
    ("top_logprobs above 20", "tok-alice", {"logprobs": True, "top_logprobs": 21}, "BadRequestError", 400,
     "invalid_value", "top_logprobs"),
    ("prompt_logprobs", "tok-alice", {"extra_body": {"database": "world_1", "prompt_logprobs": 1}},
     "BadRequestError", 400, "unsupported_parameter", "prompt_logprobs"),
    ("min_p", "tok-alice", {"extra_body": {"database": "world_1", "min_p": 0.1}}, "BadRequestError", 400,
     "unsupported_parameter", "min_p"),
    ("tools", "tok-alice", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "BadRequestError", 400,
     "unsupported_parameter", "tools"),
    ("no user message", "tok-alice", {"messages": [{"role": "system", "content": "x"}]}, "BadRequestError", 400,
     "invalid_value", "messages"),
    ("question too long", "tok-alice", {"messages": [{"role": "user", "content": "x" * 5000}]},
     "BadRequestError", 400, "context_length_exceeded", "messages"),
    ("image content", "tok-alice", {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                               "image_url": {"url": "x"}}]}]},
     "BadRequestError", 400, "invalid_value", "messages[0].content"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("token", "changes", "exc_name", "status", "code", "param"),
                         [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_in_openai_shape(serve_stack, token, changes, exc_name, status, code, param, stream):
    request = {"model": SERVED_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": QUESTION}],
               "stream": stream, "extra_body": WORLD, **changes}
    with pytest.raises(getattr(openai, exc_name)) as info:
        client(serve_stack, token).chat.completions.create(**request)
    assert info.value.status_code == status
    assert (info.value.code, info.value.param, info.value.type) == (
        code, param, "authentication_error" if status == 401 else "invalid_request_error")
    # the stack is unharmed: the next request works
    ok = client(serve_stack).chat.completions.create(model=SERVED_MODEL, max_tokens=2, extra_body=WORLD,
                                                    messages=[{"role": "user", "content": QUESTION}])
    assert ok.usage.completion_tokens == 2


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b"[" * 8000, 400, "invalid_json"),  # nested past the parser's depth: a 400, not a RecursionError 500
    (b'{"model": "random:tiny", "database": "world_1", "prompt": 42}', 400, "invalid_value"),
    (b'{"model": 7, "prompt": "How many?"}', 400, "invalid_value"),
    (b'{"model": "random:tiny", "prompt": "' + b"x" * 20_000 + b'"}', 413, "message_too_large"),
])
def test_malformed_bodies(serve_stack, body, status, code):
    response = httpx.post(f"{serve_stack.http_url}/v1/completions", content=body, timeout=60,
                          headers={"authorization": "Bearer tok-alice", "content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and set(error) == {"message", "type", "code", "param"}


def test_unknown_paths_answer_in_both_error_shapes(serve_stack):
    with pytest.raises(openai.NotFoundError) as info:
        client(serve_stack).embeddings.create(model=SERVED_MODEL, input="x")
    assert info.value.code == "not_found" and "embeddings" in info.value.message
    r = httpx.get(f"{serve_stack.http_url}/v1/nothing/here", timeout=30)
    assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND" and r.json()["error"]["code"] == "not_found"
    r = httpx.delete(f"{serve_stack.http_url}/v1/chat/completions", timeout=30)
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "code", "param"}


def test_unread_fields_are_named_in_a_header(serve_stack):
    r = httpx.post(f"{serve_stack.http_url}/v1/chat/completions", timeout=120,
                   headers={"authorization": "Bearer tok-alice"},
                   json={"model": SERVED_MODEL, "database": "world_1", "max_tokens": 2, "user": "u1",
                         "frobnicate": 1, "messages": [{"role": "user", "content": QUESTION}]})
    assert r.status_code == 200
    assert r.headers["x-headstart-ignored-params"] == "frobnicate"  # `user` changes nothing: not listed


def test_models_need_a_token(serve_stack):
    with pytest.raises(openai.AuthenticationError):
        client(serve_stack, "nope").models.list()
    with pytest.raises(openai.NotFoundError):
        client(serve_stack).models.retrieve("headstart/no_such_db")


def test_websocket_takes_the_token_in_its_subprotocol_header(serve_stack):
    """What the page does: the token in Sec-WebSocket-Protocol, not in the URL."""
    import base64

    from websockets.sync.client import connect

    def subprotocols(token: str) -> list[str]:
        return ["headstart", "bearer." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")]

    url = f"{serve_stack.ws_url}/v1/sessions/ws?db=world_1"
    with connect(url, subprotocols=subprotocols("tok-alice"), open_timeout=30) as ws:
        assert ws.subprotocol == "headstart"
        assert json.loads(ws.recv(timeout=60))["type"] == "ready"
    with connect(url, subprotocols=subprotocols("wrong"), open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=60))["code"] == "UNAUTHENTICATED"
