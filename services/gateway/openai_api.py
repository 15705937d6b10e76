"""OpenAI-compatible endpoints at the gateway, for the clients and load tools that speak it.

    GET  /health                    liveness, as vLLM answers it (load tools check it)
    GET  /v1/models                 the databases, as models `headstart/<db_id>`
    GET  /v1/models/{model}
    POST /v1/chat/completions       the last user message is the question
    POST /v1/completions            the prompt is the question

Each completion is the engine's Complete (`mode` prefix) on the database the
model id names: the same warm prompt cache (and table blocks on a stack with
`--table-cache`) that serves `POST /v1/complete` and the gRPC `Complete`.
`stream: true` answers with server-sent events ending in `data: [DONE]`;
`stream_options.include_usage` adds a last chunk with `usage`. The same bearer
tokens as every other edge; errors in OpenAI's shape (`openai_schema.py`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from headstart.client.errors import ApiError
from headstart.v1 import engine_pb2
from services.gateway.limits import check_size, check_text
from services.gateway.rest import cancel_on_disconnect
from services.gateway.openai_schema import (
    MODEL_PREFIX,
    OWNER,
    CompletionCall,
    OpenAIError,
    bad_param,
    chunk,
    full_response,
    new_id,
    parse_chat,
    parse_completion,
)
from services.gateway.service import GatewayService

EDGE = "openai"


def build_openai_router(service: GatewayService) -> APIRouter:
    router = APIRouter()

    def error_response(exc: OpenAIError) -> JSONResponse:
        service.metrics.errors.labels(edge=EDGE, code=exc.code).inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    def authenticate(request: Request) -> str:
        try:
            return service.auth.tenant(request.headers.get("authorization"))
        except ApiError as exc:
            raise OpenAIError.from_api(exc) from exc

    def known_models() -> dict[str, str]:
        return {MODEL_PREFIX + d.id: d.id for d in service.list_databases()}

    def model_entry(model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": OWNER}

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
        return {"object": "list", "data": [model_entry(m) for m in known_models()]}

    @router.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request):
        try:
            authenticate(request)
            return model_entry(_check_model(model, known_models()))
        except OpenAIError as exc:
            return error_response(exc)

    async def complete(request: Request, chat: bool):
        service.metrics.messages.labels(edge=EDGE, type="chat" if chat else "completion").inc()
        try:
            tenant = authenticate(request)
            call = (parse_chat if chat else parse_completion)(await _json_body(request, service))
            _check_model(call.model, known_models())
            _check_limits(call, chat, service)
        except OpenAIError as exc:
            return error_response(exc)
        # A client that leaves before the answer (or, streaming, before its first token) cancels
        # the generation from the first byte on; once streaming, Starlette closes the stream.
        left, answer = await cancel_on_disconnect(request, _answer(call, chat, _engine_events(service, tenant, call)))
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


async def _answer(call: CompletionCall, chat: bool, events: AsyncIterator[engine_pb2.EngineEvent]):
    """The response (a stream once the first event is in, else the whole answer), or the OpenAIError to send."""
    try:
        first = await _first_event(events)
        if call.stream:
            return StreamingResponse(_sse(call, chat, first, events), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return full_response(call, chat, await _final_result(first, events))
    except OpenAIError as exc:
        await events.aclose()
        return exc


def _check_model(model: str, known: dict[str, str]) -> str:
    """The listed id of `model` (bare db ids are accepted too); 404 model_not_found otherwise."""
    model_id = model if model.startswith(MODEL_PREFIX) else MODEL_PREFIX + model
    if model_id not in known:
        raise OpenAIError(404, f"the model {model!r} does not exist: models are databases, see GET /v1/models",
                          "model_not_found", "model")
    return model_id


def _check_limits(call: CompletionCall, chat: bool, service: GatewayService) -> None:
    limit = service.settings.max_new_tokens_limit
    if call.max_tokens is not None and call.max_tokens > limit:
        raise bad_param(call.max_tokens_param, f"at most {limit} new tokens")
    try:
        check_text(call.question, service.settings.max_text_chars)
    except ApiError as exc:
        raise OpenAIError.from_api(exc, "messages" if chat else "prompt") from exc


async def _json_body(request: Request, service: GatewayService) -> dict:
    raw = await request.body()
    try:
        check_size(len(raw), service.settings.max_message_bytes)
    except ApiError as exc:
        raise OpenAIError.from_api(exc) from exc
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise OpenAIError(400, f"malformed JSON: {exc}", "invalid_json") from exc
    except RecursionError:  # `[` x 8000: nested deeper than the parser goes (it was a 500)
        raise OpenAIError(400, "malformed JSON: nested too deeply", "invalid_json") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "the body must be a JSON object", "invalid_json")
    return data


async def _engine_events(service: GatewayService, tenant: str,
                         call: CompletionCall) -> AsyncIterator[engine_pb2.EngineEvent]:
    """The engine's events for `call`; an engine Error event is raised as OpenAIError."""
    try:
        async for event in service.complete(tenant, call.db, call.question, call.max_tokens, "prefix", None,
                                            sampling=call.sampling):
            if event.WhichOneof("kind") == "error":
                raise OpenAIError.from_api(ApiError(event.error.code, event.error.message))
            yield event
    except ApiError as exc:
        raise OpenAIError.from_api(exc) from exc


async def _first_event(events: AsyncIterator[engine_pb2.EngineEvent]) -> engine_pb2.EngineEvent:
    """Wait for the first event before answering, so a failure at the start is an HTTP error, not a stream."""
    try:
        return await anext(events)
    except StopAsyncIteration:
        raise OpenAIError(500, "the engine ended the completion without a result", "internal") from None


async def _final_result(first: engine_pb2.EngineEvent, events: AsyncIterator) -> engine_pb2.EngineEvent:
    event = first
    async with contextlib.aclosing(events):
        while event.WhichOneof("kind") != "result":
            event = await anext(events, None)
            if event is None:
                raise OpenAIError(500, "the engine ended the completion without a result", "internal")
    return event.result


async def _sse(call: CompletionCall, chat: bool, first: engine_pb2.EngineEvent,
               events: AsyncIterator[engine_pb2.EngineEvent]) -> AsyncIterator[str]:
    """Server-sent events: chunks as tokens arrive, the finish, the usage when asked, `[DONE]`."""
    response_id = new_id(chat)

    def data(body: dict) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    async with contextlib.aclosing(events):
        if chat:
            yield data(chunk(response_id, call, chat, text="", role=True))
        event = first
        try:
            while event is not None and event.WhichOneof("kind") != "result":
                if event.WhichOneof("kind") == "tokens" and event.tokens.text:
                    yield data(chunk(response_id, call, chat, text=event.tokens.text))
                event = await anext(events, None)
        except OpenAIError as exc:
            yield data(exc.body())
            return
        if event is None:
            yield data(OpenAIError(500, "the engine ended the completion without a result", "internal").body())
            return
        result = event.result
        yield data(chunk(response_id, call, chat, finish_reason=result.finish_reason or "stop"))
        if call.include_usage:
            yield data(chunk(response_id, call, chat, result=result))
        yield "data: [DONE]\n\n"
