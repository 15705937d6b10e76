"""An OpenAI request read into a `CompletionCall`, or refused naming the parameter.

What a request names:

- `model`: the served model's id, as `GET /v1/models` lists it (the
  gateway's `served_model`). `headstart/<db>` (and the bare `<db>`) are kept
  as aliases that name the model *and* the database, for clients made
  before the `database` field.
- `database` (the SDK's `extra_body`): the catalogue database whose schema
  the prompt holds; without it, the gateway's `openai_database` default.
- `session` (`extra_body`): the id of a typing session of this tenant (what
  a WebSocket `ready`, a gRPC `open` or `POST /v1/sessions` returned). The
  answer then comes from that session's cache: typed ahead, it is usually
  the whole prompt already, and the first token needs no forward pass.
- the question: the last user message (chat), or the prompt (text).

The routes (`openai_api.py`) resolve the model against the catalogue and
run the call (`openai_runs.py`); responses are built in `openai_responses.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headstart.client.errors import ApiError
from headstart.v1 import types_pb2
from services.gateway.candidates import ENGINE_MAX_CANDIDATES, candidates_from_json, is_greedy
from services.gateway.openai_errors import OpenAIError, bad_param
from services.gateway.openai_params import check_refused, choice_count, ignored_fields, sampling

MODEL_PREFIX = "headstart/"
OWNER = "headstart"


@dataclass(frozen=True)
class CompletionCall:
    """One chat or text completion, as the engine will run it."""

    model: str  # as the client sent it (echoed in responses)
    database: str | None  # the `database` field (None: from the model alias or the default)
    session: str | None
    question: str
    max_tokens: int | None
    sampling: types_pb2.SamplingParams
    n: int
    stream: bool
    include_usage: bool
    max_tokens_param: str = "max_tokens"  # the name the client used (for errors)
    ignored: list[str] = field(default_factory=list)  # fields nobody read (a response header)
    # headstart's extra field: an execution-checked answer (its `choice` comes back beside `choices`)
    candidates: types_pb2.CandidatesRequest | None = None


@dataclass(frozen=True)
class Target:
    """What a call runs on: the database, and the typing session if one was named."""

    db: str
    session: str | None


def resolve_target(call: CompletionCall, served_model: str, known_dbs: set[str], default_db: str) -> Target:
    """The database (and session) of `call`.

    Raises:
        OpenAIError: 404 `model_not_found` for a model that is neither the
            served one nor a database alias; 400 naming `database` when none
            is given and there is no default, or the alias and the field disagree.
    """
    alias = _alias_db(call.model, served_model, known_dbs)
    db = call.database or alias or default_db
    if alias and call.database and call.database != alias:
        raise bad_param("database", f"the model {call.model!r} names database {alias!r}, the database field "
                                    f"{call.database!r}")
    if not db:
        raise bad_param("database", "name the database: the body field `database` (extra_body={'database': "
                                    "'world_1'} in the SDK), or a model alias headstart/<db>")
    if db not in known_dbs:
        raise OpenAIError(404, f"unknown database {db!r} (GET /v1/databases lists them)", "database_not_found",
                          "database")
    return Target(db, call.session)


def _alias_db(model: str, served_model: str, known_dbs: set[str]) -> str | None:
    """None for the served model; the database of an alias; 404 otherwise."""
    if model == served_model:
        return None
    db = model[len(MODEL_PREFIX):] if model.startswith(MODEL_PREFIX) else model
    if db in known_dbs:
        return db
    raise OpenAIError(404, f"the model {model!r} does not exist: this server serves {served_model!r} "
                           "(GET /v1/models)", "model_not_found", "model")


def parse_chat(data: dict, max_n: int) -> CompletionCall:
    """`/v1/chat/completions`: the question is the last user message's text.

    System and earlier messages are not part of the prompt: the database's own
    prompt (instructions and schema) is what the prefix and session caches hold.
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
    param = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    return _call(data, question, data.get(param), param, max_n, chat=True)


def parse_completion(data: dict, max_n: int) -> CompletionCall:
    """`/v1/completions`: the prompt is the question (one string, or a list of one)."""
    prompt = data.get("prompt")
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise bad_param("prompt", "one prompt per request (a string or a list of one string)")
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_param("prompt", "prompt must be a string: the question (token-id prompts are not supported)")
    return _call(data, prompt, data.get("max_tokens"), "max_tokens", max_n, chat=False)


def _call(data: dict, question: str, max_tokens: object, max_param: str, max_n: int, chat: bool) -> CompletionCall:
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_param("model", "model must be a non-empty string (GET /v1/models lists it)")
    check_refused(data)
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad_param(max_param, f"{max_param} must be a positive integer")
    database, session = _optional_str(data, "database"), _optional_str(data, "session")
    n = choice_count(data, max_n)
    if session is not None and n > 1:
        raise bad_param("n", "a typing session answers one choice at a time: n must be 1 with session")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_param("stream", "stream must be a boolean")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_param("stream_options", "stream_options must be an object")
    params, _ = sampling(data, max_tokens, chat)
    candidates = _candidates(data, params, n)
    return CompletionCall(model, database, session, question, max_tokens, params, n, stream,
                          bool(options.get("include_usage")), max_param, ignored_fields(data), candidates)


def _candidates(data: dict, params: types_pb2.SamplingParams, n: int) -> types_pb2.CandidatesRequest | None:
    """headstart's `candidates` (a count or `{"k", "temperature", "seed", "wait_all"}`): one checked
    answer of the greedy one and k-1 samples; `n` keeps its OpenAI meaning (choices returned)."""
    try:
        wire = candidates_from_json(data.get("candidates"), ENGINE_MAX_CANDIDATES)  # the gateway's bound: later
    except ApiError as exc:
        raise bad_param("candidates", exc.message) from None
    if wire is not None and wire.k > 1:
        if n > 1:
            raise bad_param("candidates", "candidates check one answer: n must be 1 with candidates > 1")
        if not is_greedy(params):
            raise bad_param("candidates", "candidates need the greedy answer (temperature 0, no penalties, "
                                          "no logprobs); the sampled candidates take candidates.temperature")
    return wire


def _optional_str(data: dict, name: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise bad_param(name, f"{name} must be a non-empty string")
    return value


def _text_of(content: object, param: str) -> str:
    """A message's text: a string, or a list of `{"type": "text", "text": ...}` parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad_param(param, "the question must be text (a string or a list of text parts)")
