"""REST and SSE routes of data sessions (docs/api.md, "Data API"); the tenant comes from the bearer token.

    POST   /v1/data                   {db, retention?, retention_tokens?, buffer_rows?}
    POST   /v1/data/{sid}/rows        {rows: [{table, values}]}
    POST   /v1/data/{sid}/query       {question, max_new_tokens?, execute?}
    GET    /v1/data/{sid}             describe
    DELETE /v1/data/{sid}
    POST   /v1/data/{sid}/flash       {question}
    GET    /v1/data/{sid}/flash
    DELETE /v1/data/{sid}/flash/{qid}
    GET    /v1/data/{sid}/events      SSE (`Last-Event-ID` or ?last_event_id= resumes)

Errors are the JSON `{"code", "message"}` of the other routes. An SSE stream
that cannot go on ends with an `error` event (`sse_error`): Redis away
(UNAVAILABLE, retryable) or a resume id outside what is kept (OUT_OF_RANGE).
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from headstart.client.errors import ApiError
from services.gateway.data_events import ResumeOutOfRange
from services.gateway.rest import json_body
from services.gateway.service import GatewayService

KEEPALIVE_TICKS = 15  # quiet reads (about a second each) between SSE keep-alive comments
RETRY_MS = 1000  # an EventSource's wait before it reconnects after a retryable error


def sse_frame(event_id: str, kind: str, payload: dict) -> str:
    """One SSE event: `id` is the Redis stream id a reconnecting EventSource sends back as Last-Event-ID."""
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


def sse_error(exc: ApiError) -> str:
    """The stream's last event when it cannot go on: `error` {code, message, retryable}, no `id:`
    (a reconnect resends the last event id it saw). UNAVAILABLE (Redis away) is retryable, with a
    `retry:` hint; OUT_OF_RANGE (a resume id outside what is kept) names the oldest id kept."""
    body = {"code": exc.code, "message": exc.message, "retryable": exc.code == "UNAVAILABLE"}
    if isinstance(exc, ResumeOutOfRange):
        body |= {"oldest_id": exc.oldest_id, "newest_id": exc.newest_id}
    retry = f"retry: {RETRY_MS}\n" if body["retryable"] else ""
    return f"{retry}event: error\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"


def build_data_router(service: GatewayService) -> APIRouter:
    router = APIRouter()
    data = service.data

    def tenant(request: Request) -> str:
        return service.auth.tenant(request.headers.get("authorization"))

    async def body(request: Request) -> dict:
        return await json_body(request, service.settings.max_message_bytes)

    @router.post("/v1/data")
    async def open_data(request: Request):
        who = tenant(request)
        b = await body(request)
        return await data.open(who, b.get("db"), b.get("retention"), b.get("retention_tokens"), b.get("buffer_rows"))

    @router.post("/v1/data/{sid}/rows")
    async def push_rows(sid: str, request: Request):
        who = tenant(request)
        service.metrics.messages.labels("rest", "data_push").inc()
        b = await body(request)
        return await data.push(who, sid, b.get("rows"), b.get("push_id"))

    @router.post("/v1/data/{sid}/query")
    async def query(sid: str, request: Request):
        who = tenant(request)
        b = await body(request)
        return await data.query(who, sid, b.get("question"), b.get("max_new_tokens"), b.get("execute", True))

    @router.get("/v1/data/{sid}")
    async def describe(sid: str, request: Request):
        return await data.describe(tenant(request), sid)

    @router.delete("/v1/data/{sid}")
    async def close(sid: str, request: Request):
        return await data.close(tenant(request), sid)

    @router.post("/v1/data/{sid}/flash")
    async def register_flash(sid: str, request: Request):
        who = tenant(request)
        return await data.register_flash(who, sid, (await body(request)).get("question"))

    @router.get("/v1/data/{sid}/flash")
    async def list_flash(sid: str, request: Request):
        return await data.list_flash(tenant(request), sid)

    @router.delete("/v1/data/{sid}/flash/{qid}")
    async def delete_flash(sid: str, qid: str, request: Request):
        return await data.delete_flash(tenant(request), sid, qid)

    @router.get("/v1/data/{sid}/events")
    async def events(sid: str, request: Request):
        who = tenant(request)
        last_id = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        try:
            stream = await data.subscribe(who, sid, last_id)
        except ResumeOutOfRange as exc:  # an event, as an EventSource reads it (with the oldest id kept)
            service.metrics.errors.labels("rest", exc.code).inc()
            return StreamingResponse(iter([sse_error(exc)]), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        service.quotas.connections.acquire(who)  # a subscriber holds a socket and a reader: its tenant's share
        released = False

        async def release():
            """Once, from whichever runs first: the stream's end, or the response's background task
            (a client gone before the first byte leaves the generator never started)."""
            nonlocal released
            if not released:
                released = True
                service.quotas.connections.release(who)
                await stream.aclose()

        async def frames():
            quiet = 0
            try:
                yield ": subscribed\n\n"  # headers and a first byte now: the client knows it is subscribed
                async for item in stream:
                    if item is None:
                        quiet += 1
                        if quiet % KEEPALIVE_TICKS == 0:
                            yield ": keep-alive\n\n"
                        continue
                    yield sse_frame(*item)
            except ApiError as exc:  # Redis went away: say so (retryable) rather than just stop
                service.metrics.errors.labels("rest", exc.code).inc()
                yield sse_error(exc)
            finally:
                await release()

        return StreamingResponse(frames(), media_type="text/event-stream", background=BackgroundTask(release),
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return router
