"""The sessions of one process, bounded by count and by KV bytes, with LRU
eviction of idle ones (the byte rule: `headstart.engine.kv.memory`).

The table also charges the replica's other KV holders (data sessions) to
the same budget: they are admitted by the same rule, making room by
evicting idle typing sessions, and counted in `kv_usage`."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TypeVar

from headstart.engine.errors import ResourceExhausted, SessionNotFound
from headstart.engine.kv.state import KVState
from headstart.engine.kv.memory import KVHolder, KVMemory, KVUsage
from headstart.engine.sessions.session import Session

T = TypeVar("T")


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
        self._holders: dict[int, KVHolder] = {}  # other KV holders (data sessions), by id()
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
            try:
                self._make_room_locked(None, count=True)
            except ResourceExhausted:
                session.close()
                raise
            self._sessions[session.session_id] = session

    def admit_holder(self, holder: KVHolder, need_bytes: int) -> None:
        """Register another KV holder (a data session) about to hold
        `need_bytes`, evicting idle typing sessions to make room.

        Raises:
            ResourceExhausted: the budget has no room and no session is idle.
        """
        with self._lock:
            self._make_room_locked(need_bytes)
            self._holders[id(holder)] = holder

    def charge(self, need_bytes: int, then: Callable[[], T]) -> T:
        """Run `then()` (a registered holder taking `need_bytes` more: rows
        accepted for ingestion) once the budget has room for it, atomically
        with the check.

        Raises:
            ResourceExhausted: no room and no idle session to evict (`then` did not run).
        """
        with self._lock:
            self._make_room_locked(need_bytes)
            return then()

    def release_holder(self, holder: KVHolder) -> None:
        with self._lock:
            self._holders.pop(id(holder), None)

    def _make_room_locked(self, need_bytes: int | None, count: bool = False) -> None:
        """Evict idle sessions, least recently used first, until one more
        session (`count`: under `max_sessions` too; `need_bytes` None: its
        reserve) or `need_bytes` fits the budget."""
        while True:
            full = count and len(self._sessions) >= self.max_sessions
            if not full and (self.memory is None or not self.memory.budget_bytes):
                return  # no byte bound: nothing to count
            usage = None if full else self._usage_locked()
            if not full and (self.memory.can_admit(usage) if need_bytes is None
                             else self.memory.can_fit(usage, need_bytes)):
                return
            victim = self._idle_lru_locked()
            if victim is None:
                if full:
                    raise ResourceExhausted(f"all {self.max_sessions} sessions are busy")
                want = self.memory.session_reserve_bytes if need_bytes is None else need_bytes
                raise ResourceExhausted(
                    f"KV budget full: {usage.used_bytes} of {usage.budget_bytes} bytes in use by "
                    f"{usage.num_sessions} busy sessions and {usage.num_data_sessions} data sessions "
                    f"({usage.charged_bytes} charged; {want} more asked)")
            self._sessions.pop(victim.session_id).close()
            self.evicted += 1

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

    @property
    def num_holders(self) -> int:
        """Other KV holders registered (data sessions)."""
        with self._lock:
            return len(self._holders)

    def kv_usage(self) -> KVUsage:
        """KV bytes of the sessions and stored P0 caches (and the budget)."""
        with self._lock:
            return self._usage_locked()

    def _usage_locked(self) -> KVUsage:
        memory = self.memory or KVMemory(0, 1)
        return memory.usage([s.kv_states for s in self._sessions.values()], self._stored(), self._holders.values())

    def memory_bytes(self) -> int:
        with self._lock:
            return sum(s.stats().memory_bytes for s in self._sessions.values())

    def _idle_lru_locked(self) -> Session | None:
        for s in sorted(self._sessions.values(), key=lambda s: s.last_used):
            if s.is_idle():
                return s
        return None
