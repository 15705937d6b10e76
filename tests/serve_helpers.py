"""Helpers of the serving integration tests: a WebSocket typist, cold references."""

from __future__ import annotations

import json
import time

from websockets.sync.client import connect

MAX_NEW = 12


def ws_connect(stack, db: str = "world_1", token: str | None = "tok-alice", session: str | None = None):
    query = f"db={db}" + (f"&token={token}" if token else "") + (f"&session={session}" if session else "")
    return connect(f"{stack.ws_url}/v1/sessions/ws?{query}", open_timeout=30, max_size=4 << 20)


def recv(ws, timeout: float = 60.0) -> dict:
    return json.loads(ws.recv(timeout=timeout))


def recv_until(ws, types: set[str], timeout: float = 60.0) -> tuple[dict, list[dict]]:
    """Messages until one of `types`; returns it and everything before it."""
    seen, end = [], time.monotonic() + timeout
    while True:
        message = recv(ws, max(0.1, end - time.monotonic()))
        if message["type"] in types:
            return message, seen
        seen.append(message)


def ws_type_and_submit(ws, snapshots: list[str], max_new: int = MAX_NEW, pause_s: float = 0.0) -> tuple[dict, list[dict]]:
    """Send each snapshot as an input, then submit the last; returns (done, messages)."""
    for seq, text in enumerate(snapshots, 1):
        ws.send(json.dumps({"type": "input", "seq": seq, "text": text}))
        if pause_s:
            time.sleep(pause_s)
    ws.send(json.dumps({"type": "submit", "seq": len(snapshots) + 1, "text": snapshots[-1], "max_new_tokens": max_new}))
    return recv_until(ws, {"done", "error"})
