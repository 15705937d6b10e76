"""REST routes: health, metrics, databases, sessions, one-shot completions, Run.

Errors are JSON `{"code": ..., "message": ...}` with the code's HTTP status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from headstart.client.errors import ApiError, http_status
from services.gateway.candidates import candidates_from_json, choice_json
from services.gateway.limits import check_size
from services.gateway.service import GatewayService

EDGE = "rest"
T = TypeVar("T")


def error_response(exc: ApiError) -> JSONResponse:
    """The error as REST answers it; one with a retry hint (INGESTION_BEHIND) carries Retry-After
    (whole seconds, rounded up) and `retry_after_s` in the body."""
    body = {"code": exc.code, "message": exc.message}
    headers = None
    if exc.retry_after_s is not None:
        body["retry_after_s"] = exc.retry_after_s
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    return JSONResponse(body, status_code=http_status(exc.code), headers=headers)


async def json_body(request: Request, limit: int) -> dict:
    """The request's JSON object body (at most `limit` bytes), or ApiError INVALID_ARGUMENT / MESSAGE_TOO_LARGE."""
    raw = await request.body()
    check_size(len(raw), limit)
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise ApiError("INVALID_ARGUMENT", f"malformed JSON: {exc}") from exc
    except RecursionError:  # deeply nested arrays/objects
        raise ApiError("INVALID_ARGUMENT", "malformed JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError("INVALID_ARGUMENT", "the body must be a JSON object")
    return data


def build_router(service: GatewayService) -> APIRouter:
    router = APIRouter()

    async def body(request: Request) -> dict:
        return await json_body(request, service.settings.max_message_bytes)

    def tenant(request: Request) -> str:
        return service.auth.tenant(request.headers.get("authorization"))

    @router.get("/healthz")
    async def healthz():
        return {"status": "ok", "auth": service.auth.enabled, "sessions": service.sessions.count(),
                "connections": service.quotas.connections.total()}

    @router.get("/metrics")
    async def metrics():
        await service.refresh_engine_kv()
        service.metrics.connections.set(service.quotas.connections.total())
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @router.get("/v1/databases")
    async def databases(request: Request):
        tenant(request)
        return {"databases": [d.__dict__ for d in service.list_databases()]}

    @router.post("/v1/sessions")
    async def open_session(request: Request):
        data = await body(request)
        candidates = candidates_from_json(data.get("candidates"), service.settings.max_candidates)
        session = await service.open(tenant(request), data.get("db"), ephemeral=False, candidates=candidates)
        return {"session_id": session.session_id, "db": session.db}

    @router.delete("/v1/sessions/{session_id}")
    async def close_session(session_id: str, request: Request):
        await service.close(tenant(request), session_id)
        return {"closed": session_id}

    @router.post("/v1/complete")
    async def complete(request: Request):
        who = tenant(request)
        data = await body(request)
        candidates = candidates_from_json(data.get("candidates"), service.settings.max_candidates)

        async def generate():
            result = choice = None
            async for event in service.complete(who, data.get("db"), data.get("question"),
                                                data.get("max_new_tokens"), data.get("mode", "prefix"),
                                                data.get("tables"), candidates=candidates):
                kind = event.WhichOneof("kind")
                if kind == "error":
                    raise ApiError(event.error.code, event.error.message)
                if kind == "result":
                    result = event.result
                elif kind == "choice":
                    choice = event.choice
            if result is None:
                raise ApiError("UNAVAILABLE", "the engine ended the completion without a result")
            if result.num_candidates > 1 and choice is None:
                raise ApiError("UNAVAILABLE", "the engine ended the completion without its checked choice")
            return result, choice

        # The client may leave before the answer: then stop generating (WebSocket and gRPC do the same).
        left, answer = await cancel_on_disconnect(request, generate())
        if left:
            service.metrics.disconnects.labels(EDGE).inc()
            return Response(status_code=499)  # nobody reads it: the client is gone
        r, choice = answer
        body_out = {"sql": r.sql, "text": r.text, "token_ids": list(r.token_ids), "ttft_ms": r.ttft_ms,
                    "total_ms": r.total_ms, "prompt_tokens": r.prompt_tokens, "finish_reason": r.finish_reason,
                    "num_candidates": r.num_candidates}
        if choice is not None:  # the checked answer, with the chosen SQL's first rows
            body_out["choice"] = choice_json(choice)
        return body_out

    @router.post("/v1/execute")
    async def execute(request: Request):
        who = tenant(request)
        data = await body(request)
        return await service.execute(who, data.get("db"), data.get("sql"))

    return router


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """(False, `work`'s result), or (True, None) when the client closed the connection first: then
    `work` is cancelled, and with it the engine call it awaits (from the first byte on: a client
    gone while its prompt is still being prepared must not leave a generation running, issue 29).
    Call it once the body is read (the next message is the disconnect)."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await task
    if task.cancelled():
        return True, None
    return False, task.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body was read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
