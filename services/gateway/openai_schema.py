"""The OpenAI wire format at the gateway: request parsing, response objects, errors.

A request is read into a `CompletionCall` (the database, the question, the
sampling parameters) or rejected with an `OpenAIError` naming the offending
parameter; the routes in `openai_api.py` run the call on the engine's
Complete path and build the responses here.

Model ids name databases: `headstart/<db_id>` (what `/v1/models` lists) or the
bare `<db_id>`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from headstart.client.errors import ApiError, http_status
from headstart.v1 import types_pb2

MODEL_PREFIX = "headstart/"
OWNER = "headstart"
# Parameters that would change what is generated and that we cannot honour:
# rejected unless they hold their neutral value, so a client never gets a
# silently different answer.
_UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
                "best_of": (None, 1), "tools": (None, []), "functions": (None, []),
                "response_format": (None, {"type": "text"}), "logit_bias": (None, {})}
_OPENAI_CODES = {"UNAUTHENTICATED": "invalid_api_key", "PROMPT_TOO_LONG": "context_length_exceeded",
                 "TEXT_TOO_LONG": "context_length_exceeded", "RATE_LIMITED": "rate_limit_exceeded",
                 "RESOURCE_EXHAUSTED": "rate_limit_exceeded"}


class OpenAIError(Exception):
    """A failure in OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.type = type_ or _error_type(status)

    @classmethod
    def from_api(cls, exc: ApiError, param: str | None = None) -> "OpenAIError":
        """Our typed error (same HTTP status as REST); `code` is OpenAI's name where it has one."""
        return cls(http_status(exc.code), exc.message, _OPENAI_CODES.get(exc.code, exc.code.lower()), param)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}


def _error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def bad_param(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, "invalid_value", param)


@dataclass(frozen=True)
class CompletionCall:
    """One chat or text completion, as the engine's Complete will run it."""

    model: str
    db: str
    question: str
    max_tokens: int | None
    sampling: types_pb2.SamplingParams
    stream: bool
    include_usage: bool
    max_tokens_param: str = "max_tokens"  # the name the client used (for errors)


def db_of_model(model: object) -> str:
    """The database id a model id names (`headstart/world_1` or `world_1`)."""
    if not isinstance(model, str) or not model.strip():
        raise bad_param("model", "model must be a non-empty string naming a database (see GET /v1/models)")
    return model[len(MODEL_PREFIX):] if model.startswith(MODEL_PREFIX) else model


def parse_chat(data: dict) -> CompletionCall:
    """`/v1/chat/completions`: the question is the last user message's text.

    System and earlier messages are not part of the prompt: the database's own
    prompt (instructions and schema) is what the prefix and table caches hold.
    """
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_param("messages", "messages must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_param(f"messages[{i}]", "each message must be an object with a role")
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise bad_param("messages", "no user message: the last user message is the question")
    question = _text_of(messages[users[-1]].get("content"), f"messages[{users[-1]}].content")
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
    return _call(data, question, max_tokens, param)


def parse_completion(data: dict) -> CompletionCall:
    """`/v1/completions`: the prompt is the question (one string, or a list of one)."""
    prompt = data.get("prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise bad_param("prompt", "one prompt per request (a string or a list of one string)")
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_param("prompt", "prompt must be a string: the question (token-id prompts are not supported)")
    return _call(data, prompt, data.get("max_tokens"), "max_tokens")


def _call(data: dict, question: str, max_tokens: object, max_param: str) -> CompletionCall:
    model = data.get("model")
    db = db_of_model(model)
    for name, neutral in _UNSUPPORTED.items():
        if data.get(name) not in neutral:
            raise bad_param(name, f"{name} is not supported by headstart")
    if data.get("n", 1) != 1:
        raise bad_param("n", "n must be 1")
    if data.get("stop") not in (None, [], ""):
        raise bad_param("stop", "stop sequences are not supported (generation ends at the end of the turn)")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad_param(max_param, f"{max_param} must be a positive integer")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_param("stream", "stream must be a boolean")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_param("stream_options", "stream_options must be an object")
    return CompletionCall(model, db, question, max_tokens, _sampling(data), stream, bool(options.get("include_usage")),
                          max_param)


def _sampling(data: dict) -> types_pb2.SamplingParams:
    """Greedy unless asked: omitted `temperature` is 0 here (OpenAI's default is 1)."""
    values = {}
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high \
                or (name == "top_p" and value == 0):
            raise bad_param(name, f"{name} must be a number in {'(' if name == 'top_p' else '['}{low:g}, {high:g}]")
        values[name] = float(value)
    seed = data.get("seed")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool) or not -2**63 <= seed < 2**63:
            raise bad_param("seed", "seed must be an integer")
        values["seed"] = seed
    return types_pb2.SamplingParams(**values)


def _text_of(content: object, param: str) -> str:
    """A message's text: a string, or a list of `{"type": "text", "text": ...}` parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad_param(param, "the question must be text (a string or a list of text parts)")


# -- responses --------------------------------------------------------------

def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(result: types_pb2.Result) -> dict:
    """Prompt, cached and completion tokens of an engine result (OpenAI's `usage`)."""
    completion = len(result.token_ids)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens_at_submit}}


def headstart_extra(result: types_pb2.Result) -> dict:
    """What an OpenAI client ignores and a headstart client may read: the SQL and timings."""
    return {"sql": result.sql, "ttft_ms": result.ttft_ms, "total_ms": result.total_ms,
            "computed_tokens_at_submit": result.computed_tokens_at_submit,
            "answer_tokens_at_submit": result.answer_tokens_at_submit}


def full_response(call: CompletionCall, chat: bool, result: types_pb2.Result) -> dict:
    choice = {"index": 0, "finish_reason": result.finish_reason or "stop", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": result.text}
    else:
        choice["text"] = result.text
    return {"id": new_id(chat), "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": call.model, "choices": [choice], "usage": usage(result),
            "headstart": headstart_extra(result)}


def chunk(response_id: str, call: CompletionCall, chat: bool, *, text: str | None = None, role: bool = False,
          finish_reason: str | None = None, result: types_pb2.Result | None = None) -> dict:
    """One streamed chunk: a piece of text, the opening role, the finish, or (result) the usage."""
    body = {"id": response_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": call.model}
    if result is not None:  # the usage chunk: no choices (stream_options.include_usage)
        body.update(choices=[], usage=usage(result), headstart=headstart_extra(result))
        return body
    choice: dict = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if chat:
        delta: dict = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    body["choices"] = [choice]
    return body
