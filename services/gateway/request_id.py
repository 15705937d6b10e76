"""`x-request-id` in and out of every HTTP response of the gateway.

A client's `x-request-id` (printable ASCII, at most 128 characters) is sent
back on the response; without one (or with one we refuse to echo) the gateway
makes one. Logs and a client's traces can then name the same request. Pure
ASGI, so streamed answers (SSE) pass through untouched.
"""

from __future__ import annotations

import uuid

HEADER = b"x-request-id"
MAX_CHARS = 128


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's id when it is safe to echo, else a fresh one."""
    for name, value in headers:
        if name.lower() == HEADER:
            text = value.decode("latin-1")
            if 0 < len(text) <= MAX_CHARS and text.isprintable() and text.isascii():
                return text
            break
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Adds `x-request-id` to every HTTP response (WebSocket connections pass through)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope.get("headers") or [])
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid.encode("latin-1"))]}
            await send(message)

        await self.app(scope, receive, send_with_id)
