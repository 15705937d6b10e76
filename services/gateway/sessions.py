"""The gateway's sessions: the text and sequence numbers each user typed.

The gateway is the source of truth for a session's text; the engine holds a
cache of it that can be rebuilt at any time from the newest snapshot. Ids are
scoped by tenant: another tenant's id is simply not found.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from dataclasses import dataclass, field

from headstart.client.errors import ApiError
from headstart.v1 import engine_pb2


# Put in a listener's queue when another connection attached to its session:
# the edge tells its client (SESSION_MOVED) and ends, instead of both sharing one queue.
TAKEN_OVER = object()
# Put in every tap when the session closes: a reader waiting for an answer ends.
SESSION_ENDED = object()


def engine_session_id(tenant: str, session_id: str) -> str:
    """The id the engine sees: namespaced by tenant, deterministic (not Python's hash)."""
    return hashlib.sha256(f"{tenant}\0{session_id}".encode()).hexdigest()[:32]


@dataclass
class GatewaySession:
    """One session. `listener` is the event queue of the one edge connection attached to it."""

    session_id: str
    tenant: str
    db: str
    ephemeral: bool  # closed when its connection ends (WebSocket / Type without OpenSession)
    seq: int = 0
    text: str = ""
    link: object | None = None  # EngineLink, set once the engine attached
    listener: asyncio.Queue | None = None
    # the task of the edge connection that attached the listener: a listener whose
    # task has ended without detaching is a leak the reaper closes (`orphaned`)
    owner: asyncio.Task | None = None
    # Readers of one answer (an OpenAI completion naming the session): they get
    # every event too, beside the connection, which keeps the session.
    taps: list[asyncio.Queue] = field(default_factory=list)
    submitted_seq: int = 0
    last_active: float = field(default_factory=time.monotonic)

    def attach_listener(self) -> asyncio.Queue:
        """A fresh queue for the calling connection (its task owns it); the previous one gets TAKEN_OVER."""
        previous, self.listener = self.listener, asyncio.Queue()
        self.owner = asyncio.current_task()
        if previous is not None:
            previous.put_nowait(TAKEN_OVER)
        self.touch()
        return self.listener

    def detach_listener(self, queue: asyncio.Queue) -> None:
        if self.listener is queue:
            self.listener, self.owner = None, None
        self.touch()

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def orphaned(self) -> bool:
        """True when no live connection holds the session: none attached, or the one that
        attached has ended without saying so (every way out of an edge detaches: a leak)."""
        return self.listener is None or (self.owner is not None and self.owner.done())

    def idle_for(self) -> float:
        """Seconds since the last message, or 0 while a live connection is attached."""
        return time.monotonic() - self.last_active if self.orphaned() else 0.0

    def accept(self, seq: int) -> bool:
        """True when `seq` is newer than the last accepted snapshot (else: reordered, ignored)."""
        return seq > self.seq

    def latest(self) -> tuple[int, str]:
        return self.seq, self.text

    def deliver(self, event: engine_pb2.EngineEvent) -> None:
        """To the attached connection and the taps; with none the event is dropped (nobody reads it)."""
        if self.listener is not None:
            self.listener.put_nowait(event)
        for tap in self.taps:
            tap.put_nowait(event)

    def add_tap(self) -> asyncio.Queue:
        """A queue that gets every event from now on, until `remove_tap`."""
        tap: asyncio.Queue = asyncio.Queue()
        self.taps.append(tap)
        self.touch()
        return tap

    def remove_tap(self, tap: asyncio.Queue) -> None:
        if tap in self.taps:
            self.taps.remove(tap)
        self.touch()

    def end_taps(self) -> None:
        """The session closed: every tap's reader gets SESSION_ENDED."""
        for tap in self.taps:
            tap.put_nowait(SESSION_ENDED)


class SessionRegistry:
    """All sessions of this gateway process, by (tenant, id)."""

    def __init__(self, max_per_tenant: int):
        self.max_per_tenant = max_per_tenant
        self._sessions: dict[tuple[str, str], GatewaySession] = {}

    def create(self, tenant: str, db: str, ephemeral: bool) -> GatewaySession:
        if self.count(tenant) >= self.max_per_tenant:
            raise ApiError("RESOURCE_EXHAUSTED", f"this tenant has its share of {self.max_per_tenant} open sessions")
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

    def all(self) -> list[GatewaySession]:
        return list(self._sessions.values())
