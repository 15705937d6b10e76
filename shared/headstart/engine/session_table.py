"""The sessions of one process, bounded by count and by KV bytes, with LRU
eviction of idle ones (the byte rule: `headstart.engine.kv_memory`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from headstart.engine.errors import ResourceExhausted, SessionNotFound
from headstart.engine.kv import KVState
from headstart.engine.kv_memory import KVMemory, KVUsage
from headstart.engine.session import Session


class SessionTable:
    """Args:
        max_sessions: sessions held at most.
        memory: the replica's KV budget (None: no byte bound).
        stored: the P0 caches held outside sessions (counted in the usage).
    """

    def __init__(self, max_sessions: int, memory: KVMemory | None = None,
                 stored: Callable[[], Iterable[KVState]] = tuple):
        self.max_sessions = max_sessions
        self.memory = memory
        self._stored = stored
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted = 0

    def add(self, session: Session) -> None:
        """Register a session, evicting least recently used idle ones while the
        table is full or the KV budget has no room for one more session.

        Raises:
            ResourceExhausted: full, and no session is idle.
        """
        with self._lock:
            if session.session_id in self._sessions:
                self._sessions.pop(session.session_id).close()
            while True:
                full = len(self._sessions) >= self.max_sessions
                usage = None if full or self.memory is None else self._usage_locked()
                if not full and (usage is None or self.memory.can_admit(usage)):
                    break
                victim = self._idle_lru_locked()
                if victim is None:
                    session.close()
                    if full:
                        raise ResourceExhausted(f"all {self.max_sessions} sessions are busy")
                    raise ResourceExhausted(
                        f"KV budget full: {usage.used_bytes} of {usage.budget_bytes} bytes in use by "
                        f"{usage.num_sessions} busy sessions")
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

    def kv_usage(self) -> KVUsage:
        """KV bytes of the sessions and stored P0 caches (and the budget)."""
        with self._lock:
            return self._usage_locked()

    def _usage_locked(self) -> KVUsage:
        memory = self.memory or KVMemory(0, 1)
        return memory.usage([s.kv_state for s in self._sessions.values()], self._stored())

    def memory_bytes(self) -> int:
        with self._lock:
            return sum(s.stats().memory_bytes for s in self._sessions.values())

    def _idle_lru_locked(self) -> Session | None:
        for s in sorted(self._sessions.values(), key=lambda s: s.last_used):
            if s.is_idle():
                return s
        return None
