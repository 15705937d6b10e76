"""The gateway's sessions: the text and sequence numbers each user typed.

The gateway is the source of truth for a session's text; the engine holds a
cache of it that can be rebuilt at any time from the newest snapshot. Ids are
scoped by tenant: another tenant's id is simply not found.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from dataclasses import dataclass, field

from headstart.client.errors import ApiError
from headstart.v1 import engine_pb2


def engine_session_id(tenant: str, session_id: str) -> str:
    """The id the engine sees: namespaced by tenant, deterministic (not Python's hash)."""
    return hashlib.sha256(f"{tenant}\0{session_id}".encode()).hexdigest()[:32]


@dataclass
class GatewaySession:
    """One session. `events` is the queue of the edge connection attached to it."""

    session_id: str
    tenant: str
    db: str
    ephemeral: bool  # closed when its connection ends (WebSocket / Type without OpenSession)
    seq: int = 0
    text: str = ""
    link: object | None = None  # EngineLink, set once the engine attached
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted_seq: int = 0

    def accept(self, seq: int) -> bool:
        """True when `seq` is newer than the last accepted snapshot (else: reordered, ignored)."""
        return seq > self.seq

    def latest(self) -> tuple[int, str]:
        return self.seq, self.text

    def deliver(self, event: engine_pb2.EngineEvent) -> None:
        self.events.put_nowait(event)


class SessionRegistry:
    """All sessions of this gateway process, by (tenant, id)."""

    def __init__(self, max_per_tenant: int):
        self.max_per_tenant = max_per_tenant
        self._sessions: dict[tuple[str, str], GatewaySession] = {}

    def create(self, tenant: str, db: str, ephemeral: bool) -> GatewaySession:
        if self.count(tenant) >= self.max_per_tenant:
            raise ApiError("RESOURCE_EXHAUSTED", f"tenant has {self.max_per_tenant} open sessions")
        session = GatewaySession(uuid.uuid4().hex, tenant, db, ephemeral)
        self._sessions[(tenant, session.session_id)] = session
        return session

    def get(self, tenant: str, session_id: str) -> GatewaySession:
        """Raises ApiError(NOT_FOUND) for unknown ids and for other tenants' ids alike."""
        session = self._sessions.get((tenant, session_id))
        if session is None:
            raise ApiError("NOT_FOUND", f"no session {session_id!r}")
        return session

    def pop(self, tenant: str, session_id: str) -> GatewaySession | None:
        return self._sessions.pop((tenant, session_id), None)

    def count(self, tenant: str | None = None) -> int:
        return sum(1 for t, _ in self._sessions if tenant is None or t == tenant)
