"""The data sessions one replica holds, keyed by session id, each with its tenant.

A call names a session id and works for a tenant (`headstart-tenant`); a
session is found only when both match. Another tenant's id and an id this
replica never held (or lost with a restart) look the same to the caller:
NOT_FOUND "data session not on this replica", after which the gateway
re-opens it here with the rows it holds (the rebuild source). The registry
only maps ids to sessions: building, pushing and querying are the
`DataSession`'s, run off the event loop by services/engine/data_service.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from headstart.data import DataSession
from headstart.data.lag import LagHistogram, LagSummary
from headstart.engine.errors import InvalidInput, ResourceExhausted, SessionNotFound

NOT_HELD = "data session not on this replica"


class DataSessionNotHeld(SessionNotFound):
    """The replica holds no data session of that id for the call's tenant (NOT_FOUND)."""

    def __init__(self):
        super().__init__(NOT_HELD)


class DataRegistry:
    """Data sessions by id, at most `max_sessions` of them.

    `open` builds a session with `build()` on the calling thread (it blocks
    on the forward worker: call it from a thread, not the event loop) and is
    single-flight per id: a second open of the same id waits for the first
    and gets its session.
    """

    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self.lag_histogram = LagHistogram()  # its sessions' push delays, acknowledged to handled (/metrics)
        self._sessions: dict[str, DataSession] = {}
        self._opening: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def open(self, session_id: str, tenant: str | None, build: Callable[[], DataSession]) -> tuple[DataSession, bool]:
        """The session `session_id` of `tenant`, built by `build()` when absent.

        Returns:
            (session, opened): opened is False when the replica held it already.
        Raises:
            InvalidInput: empty id, or the id is another tenant's.
            ResourceExhausted: `max_sessions` data sessions are open here.
        """
        if not session_id:
            raise InvalidInput("session_id is required")
        with self._lock:
            gate = self._opening.setdefault(session_id, threading.Lock())
        with gate:  # NOTE: per id, so a slow open (a long rebuild) never holds other ids' opens
            with self._lock:
                held = self._sessions.get(session_id)
                if held is not None:
                    if held.tenant != tenant:
                        # ids are tenant-scoped by the gateway: this is a caller's mistake, not a lookup
                        raise InvalidInput("data session id is in use")
                    return held, False
                if len(self._sessions) >= self.max_sessions:
                    raise ResourceExhausted(f"replica full: {self.max_sessions} data sessions open")
            try:
                session = build()
            finally:
                with self._lock:
                    self._opening.pop(session_id, None)
            with self._lock:
                # a caller that came after the gate was dropped may have built it meanwhile: keep one
                raced = self._sessions.setdefault(session_id, session)
            if raced is not session:
                session.close()
                return raced, False
            return session, True

    def get(self, session_id: str, tenant: str | None) -> DataSession:
        """The open session `session_id` of `tenant` (raises DataSessionNotHeld)."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None or session.tenant != tenant:
            raise DataSessionNotHeld()
        return session

    def pop(self, session_id: str, tenant: str | None) -> DataSession | None:
        """Remove and return `tenant`'s session `session_id` (None when not held; another
        tenant's session stays)."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.tenant != tenant:
                return None
            return self._sessions.pop(session_id)

    def sessions(self) -> list[DataSession]:
        with self._lock:
            return list(self._sessions.values())

    def lag_summary(self) -> LagSummary:
        """The held sessions' lag: the worst and the total (`headstart.data.lag`)."""
        return LagSummary.of(session.lag() for session in self.sessions())

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def close_all(self) -> None:
        """Close every session (replica shutdown)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            try:
                session.close()
            except Exception:
                pass
