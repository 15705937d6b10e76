"""OpenAI-compatible endpoints at the gateway, for the SDKs and the load tools that speak it.

    GET  /health                    liveness, as vLLM answers it (load tools check it)
    GET  /v1/models                 the served model (the gateway's `served_model`)
    GET  /v1/models/{model}         it, or a `headstart/<db>` alias
    POST /v1/chat/completions       the last user message is the question
    POST /v1/completions            the prompt is the question

A request names the model, the database (`database`, or an alias model id)
and optionally a typing session (`session`); `openai_schema.py` reads it,
`openai_params.py` its generation parameters, `openai_runs.py` runs its
choices on the engine, `openai_responses.py` builds the answer. `stream:
true` answers with server-sent events ending in `data: [DONE]`;
`stream_options.include_usage` adds a last chunk with `usage`. headstart's
extra body field `candidates` asks for an execution-checked answer: the
response (or, streaming, a last chunk with no choices) carries `choice`
(services/gateway/candidates.py), `n` keeps its OpenAI meaning. The same
bearer tokens as every other edge; errors in OpenAI's shape
(`openai_errors.py`). Request fields nobody read are named in the response
header `x-headstart-ignored-params`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from headstart.client.errors import ApiError
from headstart.v1 import types_pb2
from services.gateway.candidates import choice_json
from services.gateway.limits import check_size, check_text
from services.gateway.openai_errors import OpenAIError, bad_param
from services.gateway.openai_responses import chunk, full_response, logprobs_body, new_id, usage_chunk
from services.gateway.openai_runs import ChoiceEvent, choice_events
from services.gateway.openai_schema import (
    MODEL_PREFIX,
    OWNER,
    CompletionCall,
    parse_chat,
    parse_completion,
    resolve_target,
)
from services.gateway.rest import cancel_on_disconnect
from services.gateway.service import GatewayService

EDGE = "openai"
IGNORED_HEADER = "x-headstart-ignored-params"


def build_openai_router(service: GatewayService) -> APIRouter:
    router = APIRouter()
    settings = service.settings
    served = settings.served_model

    def error_response(exc: OpenAIError) -> JSONResponse:
        service.metrics.errors.labels(edge=EDGE, code=exc.code).inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    def authenticate(request: Request) -> str:
        try:
            return service.auth.tenant(request.headers.get("authorization"))
        except ApiError as exc:
            raise OpenAIError.from_api(exc) from exc

    def known_dbs() -> set[str]:
        return {d.id for d in service.list_databases()}

    def model_entry(model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": OWNER, "root": served,
                "parent": None if model_id == served else served}

    @router.get("/health")
    async def health():
        """vLLM's liveness route: OpenAI-API load tools (guidellm) check it before a run."""
        return {"status": "ok"}

    @router.get("/v1/models")
    async def list_models(request: Request):
        try:
            authenticate(request)
        except OpenAIError as exc:
            return error_response(exc)
        return {"object": "list", "data": [model_entry(served)]}

    @router.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request):
        try:
            authenticate(request)
            db = model[len(MODEL_PREFIX):] if model.startswith(MODEL_PREFIX) else model
            if model != served and db not in known_dbs():
                raise OpenAIError(404, f"the model {model!r} does not exist: this server serves {served!r}",
                                  "model_not_found", "model")
            return model_entry(model)
        except OpenAIError as exc:
            return error_response(exc)

    async def complete(request: Request, chat: bool):
        service.metrics.messages.labels(edge=EDGE, type="chat" if chat else "completion").inc()
        try:
            tenant = authenticate(request)
            data = await _json_body(request, settings.max_message_bytes)
            call = (parse_chat if chat else parse_completion)(data, settings.openai_max_n)
            target = resolve_target(call, served, known_dbs(), settings.openai_database)
            _check_limits(call, chat, service)
        except OpenAIError as exc:
            return error_response(exc)
        # A client that leaves before the answer (or, streaming, before its first token) cancels
        # the generation from the first byte on; once streaming, Starlette closes the stream.
        events = choice_events(service, tenant, call, target)
        left, answer = await cancel_on_disconnect(request, _answer(call, chat, events))
        if left:
            service.metrics.disconnects.labels(EDGE).inc()
            return Response(status_code=499)  # nobody reads it: the client is gone
        return error_response(answer) if isinstance(answer, OpenAIError) else answer

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @router.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    return router


def _check_limits(call: CompletionCall, chat: bool, service: GatewayService) -> None:
    limit = service.settings.max_new_tokens_limit
    if call.max_tokens is not None and call.max_tokens > limit:
        raise bad_param(call.max_tokens_param, f"at most {limit} new tokens")
    max_k = service.settings.max_candidates
    if call.candidates is not None and call.candidates.k > max_k:
        raise bad_param("candidates", f"candidates k must be an integer between 1 and {max_k}, "
                                      f"not {call.candidates.k}")
    try:
        check_text(call.question, service.settings.max_text_chars)
    except ApiError as exc:
        raise OpenAIError.from_api(exc, "messages" if chat else "prompt") from exc


async def _json_body(request: Request, limit: int) -> dict:
    raw = await request.body()
    try:
        check_size(len(raw), limit)
    except ApiError as exc:
        raise OpenAIError.from_api(exc) from exc
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise OpenAIError(400, f"malformed JSON: {exc}", "invalid_json") from exc
    except RecursionError:  # `[` x 8000: nested deeper than the parser goes
        raise OpenAIError(400, "malformed JSON: nested too deeply", "invalid_json") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "the body must be a JSON object", "invalid_json")
    return data


async def _answer(call: CompletionCall, chat: bool, events: AsyncIterator[ChoiceEvent]):
    """The response (a stream once the first event is in, else the whole answer), or the OpenAIError to send."""
    try:
        first = await _first_event(events)
        headers = {IGNORED_HEADER: ",".join(call.ignored)} if call.ignored else {}
        response_id = new_id(chat)
        if call.stream:
            return StreamingResponse(_sse(call, chat, response_id, first, events), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", **headers})
        results, logprobs, choice = await _final_results(call.n, first, events)
        body = full_response(call, chat, results, response_id, logprobs if call.sampling.logprobs else None)
        if choice is not None:  # headstart's extra field: the checked answer with its rows
            body["choice"] = choice_json(choice)
        return JSONResponse(body, headers=headers)
    except OpenAIError as exc:
        await events.aclose()
        return exc


async def _first_event(events: AsyncIterator[ChoiceEvent]) -> ChoiceEvent:
    """Wait for the first event before answering, so a failure at the start is an HTTP error, not a stream."""
    try:
        return await anext(events)
    except StopAsyncIteration:
        raise OpenAIError(500, "the engine ended the completion without a result", "internal") from None


async def _final_results(n: int, first: ChoiceEvent, events: AsyncIterator[ChoiceEvent]
                         ) -> tuple[list[types_pb2.Result], list[list[types_pb2.TokenLogprob]],
                                    types_pb2.Choice | None]:
    """Every choice's Result and token log-probabilities (empty when not asked), in index order,
    and the checked answer's Choice (None: no candidates)."""
    results: dict[int, types_pb2.Result] = {}
    choice: types_pb2.Choice | None = None
    logprobs: list[list[types_pb2.TokenLogprob]] = [[] for _ in range(n)]
    item: ChoiceEvent | None = first
    async with contextlib.aclosing(events):
        while item is not None:
            index, event = item
            kind = event.WhichOneof("kind")
            if kind == "result":
                results[index] = event.result
            elif kind == "tokens":
                logprobs[index].extend(event.tokens.logprobs)
            elif kind == "choice":
                choice = event.choice
            item = await anext(events, None)
    if len(results) != n:
        raise OpenAIError(500, "the engine ended a choice without a result", "internal")
    if choice is None and results[0].num_candidates > 1:
        raise OpenAIError(500, "the engine ended the answer without its checked choice", "internal")
    return [results[i] for i in range(n)], logprobs, choice


async def _sse(call: CompletionCall, chat: bool, response_id: str, first: ChoiceEvent,
               events: AsyncIterator[ChoiceEvent]) -> AsyncIterator[str]:
    """Server-sent events: chunks as tokens arrive, each choice's finish, the usage when asked, `[DONE]`."""

    def data(body: dict) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    results: dict[int, types_pb2.Result] = {}
    # log-probabilities of tokens whose text is not out yet (a held-back or partial character)
    pending: dict[int, list] = {i: [] for i in range(call.n)}
    offsets = dict.fromkeys(range(call.n), 0)

    def logprobs_of(index: int) -> dict | None:
        if not call.sampling.logprobs:
            return None
        body = logprobs_body(chat, pending[index], offsets[index])
        offsets[index] += sum(len(e.token) for e in pending[index])
        pending[index] = []
        return body

    async with contextlib.aclosing(events):
        if chat:
            for index in range(call.n):
                yield data(chunk(response_id, call, chat, index, text="", role=True))
        item: ChoiceEvent | None = first
        try:
            while item is not None:
                index, event = item
                kind = event.WhichOneof("kind")
                if kind == "tokens":
                    pending[index].extend(event.tokens.logprobs)
                    if event.tokens.text:
                        yield data(chunk(response_id, call, chat, index, text=event.tokens.text,
                                         logprobs=logprobs_of(index)))
                elif kind == "result":
                    results[index] = event.result
                    yield data(chunk(response_id, call, chat, index, finish_reason=event.result.finish_reason or "stop",
                                     logprobs=logprobs_of(index) if pending[index] else None))
                elif kind == "choice":  # the checked answer: a chunk of no choices with headstart's `choice`
                    yield data(chunk(response_id, call, chat, index) | {"choices": [],
                                                                        "choice": choice_json(event.choice)})
                item = await anext(events, None)
        except OpenAIError as exc:
            yield data(exc.body())
            return
        if len(results) != call.n:
            yield data(OpenAIError(500, "the engine ended a choice without a result", "internal").body())
            return
        if call.include_usage:
            yield data(usage_chunk(response_id, call, chat, [results[i] for i in range(call.n)]))
        yield "data: [DONE]\n\n"
