"""The sessions of one process, bounded, with LRU eviction of idle ones."""

from __future__ import annotations

import threading
from collections import OrderedDict

from headstart.engine.errors import ResourceExhausted, SessionNotFound
from headstart.engine.session import Session


class SessionTable:
    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted = 0

    def add(self, session: Session) -> None:
        """Register a session, evicting the least recently used idle one when full."""
        with self._lock:
            if session.session_id in self._sessions:
                self._sessions.pop(session.session_id).close()
            while len(self._sessions) >= self.max_sessions:
                victim = self._idle_lru_locked()
                if victim is None:
                    session.close()
                    raise ResourceExhausted(f"all {self.max_sessions} sessions are busy")
                self._sessions.pop(victim.session_id).close()
                self.evicted += 1
            self._sessions[session.session_id] = session

    def get(self, session_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise SessionNotFound(f"no session {session_id!r} in this process")
            self._sessions.move_to_end(session_id)
            return session

    def contains(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._sessions

    def remove(self, session_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is not None:
            session.close()

    def close_all(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), OrderedDict()
        for s in sessions:
            s.close()

    def __len__(self) -> int:
        return len(self._sessions)

    def memory_bytes(self) -> int:
        with self._lock:
            return sum(s.stats().memory_bytes for s in self._sessions.values())

    def _idle_lru_locked(self) -> Session | None:
        for s in sorted(self._sessions.values(), key=lambda s: s.last_used):
            if s.is_idle():
                return s
        return None
