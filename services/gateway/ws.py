"""The browser edge: `GET /v1/sessions/ws?db=DB` (protocol in docs/api.md, "WebSocket protocol").

Client → server: {"type":"input","seq":n,"text":...}, {"type":"submit","seq":n,
"text":...,"max_new_tokens":k,"candidates":K}, {"type":"cancel"}, and rows for a data session
{"type":"data_push","session_id":...,"rows":[...]} (also on a connection
opened with `?data=1`, which has no typing session). `?candidates=K` on the URL
gives a new session candidates decoded during the pauses. Server → client: ready,
progress, token, done, choice (the checked answer with its rows, after done),
data_ack, error (each with a "type"). A bad message gets an error reply and the
connection stays open; the session closes with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from fastapi import WebSocket, WebSocketDisconnect

from headstart.client.errors import ApiError
from headstart.v1 import engine_pb2
from services.gateway.auth import websocket_token
from services.gateway.candidates import candidates_from_json, choice_json
from services.gateway.limits import RateLimiter, check_size
from services.gateway.service import GatewayService
from services.gateway.sessions import TAKEN_OVER

EDGE = "ws"
log = logging.getLogger(__name__)
# NOTE: an application close code (4000-4999) tells the page why it was dropped.
CLOSE_CODES = {"INVALID_ARGUMENT": 4400, "UNAUTHENTICATED": 4401, "NOT_FOUND": 4404, "SESSION_MOVED": 4409,
               "RESOURCE_EXHAUSTED": 4429, "RATE_LIMITED": 4429, "UNAVAILABLE": 4503}


def event_json(event: engine_pb2.EngineEvent) -> dict | None:
    """An engine event as a WebSocket message (None: nothing to send)."""
    kind = event.WhichOneof("kind")
    if kind == "progress":
        p = event.progress
        return {"type": "progress", "seq": p.seq, "cached_tokens": p.cached_tokens, "prompt_tokens": p.prompt_tokens,
                "schema_tokens": p.schema_tokens}
    if kind == "tokens":
        return {"type": "token", "text": event.tokens.text} if event.tokens.text else None
    if kind == "result":
        r = event.result
        return {"type": "done", "seq": r.seq, "sql": r.sql, "text": r.text, "token_ids": list(r.token_ids),
                "ttft_ms": r.ttft_ms, "total_ms": r.total_ms, "prompt_tokens": r.prompt_tokens,
                "cached_tokens_at_submit": r.cached_tokens_at_submit,
                "computed_tokens_at_submit": r.computed_tokens_at_submit,
                "answer_tokens_at_submit": r.answer_tokens_at_submit, "finish_reason": r.finish_reason,
                "num_candidates": r.num_candidates}
    if kind == "choice":
        return {"type": "choice", **choice_json(event.choice)}
    if kind == "error":
        return error_json(event.error.code, event.error.message, event.error.seq)
    return None


def error_json(code: str, message: str, seq: int = 0, retry_after_s: float | None = None) -> dict:
    out = {"type": "error", "code": code, "message": message}
    if seq:
        out["seq"] = seq
    if retry_after_s is not None:  # a backpressure refusal (INGESTION_BEHIND): when to send again
        out["retry_after_s"] = retry_after_s
    return out


async def session_socket(ws: WebSocket, service: GatewayService) -> None:
    """Serve one WebSocket connection from accept to close, counted in its tenant's connection share.

    The token: `Authorization: Bearer T` (clients that can set headers), the
    subprotocol `bearer.<base64url T>` beside `headstart` (browsers: the page),
    or `?token=T` (older clients; it ends up in access logs: avoid it)."""
    try:
        offered, subprotocol = websocket_token(ws.headers.get("sec-websocket-protocol"))
    except ApiError as exc:
        await ws.accept()
        await _refuse(ws, service, exc)
        return
    await ws.accept(subprotocol=subprotocol)
    try:
        tenant = service.auth.tenant(*credentials(ws.headers.get("authorization"),
                                                  ws.query_params.get("token") or offered))
        service.quotas.connections.acquire(tenant)
    except ApiError as exc:
        await _refuse(ws, service, exc)
        return
    try:
        await _serve_socket(ws, service, tenant)
    finally:
        service.quotas.connections.release(tenant)


def credentials(authorization: str | None, token: str | None) -> tuple[str | None, str | None]:
    """What a WebSocket authenticates with: its `Authorization` header when it sends one, else its
    subprotocol token or `?token=` (browsers cannot set headers on a WebSocket). The header wins: a URL (logged, shared, put in a
    page by someone else) must not override the credentials the client itself sent (issue 29)."""
    return (authorization, None) if authorization else (None, token)


async def _refuse(ws: WebSocket, service: GatewayService, exc: ApiError) -> None:
    """An error at connect: the message, then the close code of its class (the client may be gone)."""
    service.metrics.errors.labels(EDGE, exc.code).inc()
    try:
        await ws.send_json(error_json(exc.code, exc.message))
        await ws.close(CLOSE_CODES.get(exc.code, 1011))
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


@dataclass(frozen=True)
class DataOnly:
    """A connection opened with `?data=1`: no typing session, only `data_push` messages."""

    tenant: str


async def _serve_socket(ws: WebSocket, service: GatewayService, tenant: str) -> None:
    if ws.query_params.get("data") == "1":  # a producer of rows: no typing session, no replica slot
        await ws.send_json({"type": "ready", "data": True})
        await _receive(ws, service, DataOnly(tenant))
        return
    try:
        sid, db = ws.query_params.get("session"), ws.query_params.get("db", "")
        candidates = _query_candidates(ws.query_params.get("candidates"), service.settings.max_candidates)
        session = service.get(tenant, sid) if sid else await service.open(tenant, db, True, candidates)
    except ApiError as exc:
        await _refuse(ws, service, exc)
        return
    # A session has one listener: attaching takes it over (the previous connection is told SESSION_MOVED).
    events = session.attach_listener() if sid else session.listener
    taken_over = False
    try:
        # NOTE: inside the try: a client that left while its session opened makes this send
        # raise, and its session must be closed all the same (issue 29: they leaked)
        await ws.send_json({"type": "ready", "session": session.session_id, "db": session.db})
        sender = asyncio.create_task(_send_events(ws, events))
        receiver = asyncio.create_task(_receive(ws, service, session))
        try:
            await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sender.cancel()
            receiver.cancel()
        taken_over = sender.done() and not sender.cancelled() and sender.exception() is None
    except WebSocketDisconnect:
        pass  # the client left while its session opened: nothing to tell it
    finally:
        session.detach_listener(events)
        if not taken_over:
            await service.release(session)  # closes the connection's own session, else stops its answer
    if taken_over:
        service.metrics.errors.labels(EDGE, "SESSION_MOVED").inc()
        try:
            await ws.send_json(error_json("SESSION_MOVED", "another connection attached to this session"))
            await ws.close(CLOSE_CODES["SESSION_MOVED"])
        except Exception:  # the client left meanwhile
            pass


def _query_candidates(value: str | None, max_k: int):
    """`?candidates=K`: a new session's candidates (absent: the engine's default)."""
    if value is None:
        return None
    try:
        k = int(value)
    except ValueError:
        raise ApiError("INVALID_ARGUMENT", f"candidates must be an integer between 1 and {max_k}") from None
    return candidates_from_json(k, max_k)


async def _send_events(ws: WebSocket, events: asyncio.Queue) -> None:
    """Forward events until another connection takes the session over (then return)."""
    while True:
        event = await events.get()
        if event is TAKEN_OVER:
            return
        message = event_json(event)
        if message is not None:
            await ws.send_json(message)


async def _receive(ws: WebSocket, service: GatewayService, session) -> None:
    limiter = RateLimiter(service.settings.rate_per_s, service.settings.rate_burst)
    while True:
        try:
            raw = await ws.receive()
        except (WebSocketDisconnect, RuntimeError):
            return
        if raw["type"] == "websocket.disconnect":
            return
        data = raw.get("text") if raw.get("text") is not None else raw.get("bytes") or b""
        try:
            check_size(len(data.encode() if isinstance(data, str) else data), service.settings.max_message_bytes)
            limiter.take()
            reply = await _dispatch(service, session, _parse(data))
            if reply is not None:
                await ws.send_json(reply)
        except ApiError as exc:
            service.metrics.errors.labels(EDGE, exc.code).inc()
            await ws.send_json(error_json(exc.code, exc.message, exc.seq, exc.retry_after_s))
        except Exception as exc:  # a bug must cost one message, not the connection
            log.exception("websocket message failed")
            service.metrics.errors.labels(EDGE, "INTERNAL").inc()
            await ws.send_json(error_json("INTERNAL", f"{type(exc).__name__}"))


def _parse(data: str | bytes) -> dict:
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError("INVALID_ARGUMENT", f"malformed JSON: {exc}") from exc
    except RecursionError:  # deeply nested arrays/objects
        raise ApiError("INVALID_ARGUMENT", "malformed JSON: nested too deeply") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ApiError("INVALID_ARGUMENT", 'a message is a JSON object with a "type"')
    return message


async def _dispatch(service: GatewayService, session, message: dict) -> dict | None:
    """Act on one message; returns the direct reply to send (a data_push's data_ack), if any."""
    kind = message["type"]
    service.metrics.messages.labels(EDGE, kind if kind in ("input", "submit", "cancel", "data_push") else "other").inc()
    if isinstance(session, DataOnly) and kind != "data_push":
        raise ApiError("INVALID_ARGUMENT", f"a ?data=1 connection takes data_push messages only, not {kind!r}")
    if kind == "input":
        await service.input(session, message.get("seq"), message.get("text"))
    elif kind == "submit":
        await service.submit(session, message.get("seq"), message.get("text"), message.get("max_new_tokens"),
                             candidates=candidates_from_json(message.get("candidates"), service.settings.max_candidates))
    elif kind == "cancel":
        service._check_link(session)
        await session.link.cancel_generation()
    elif kind == "data_push":  # rows for a data session of this connection's tenant
        ack = await service.data.push(session.tenant, message.get("session_id"), message.get("rows"),
                                      message.get("push_id"))
        return {"type": "data_ack", "session_id": message["session_id"], **ack}
    else:
        raise ApiError("INVALID_ARGUMENT", f"unknown message type {kind!r}; valid: input, submit, cancel, data_push")
    return None
