"""A replica's sessions and their admission control, independent of Ray.

`ReplicaCore` wraps one `EngineRuntime` (one model, one forward worker with a
priority queue) and counts the session streams attached to it. The Serve
deployment and the tests both drive it; nothing here knows about Ray.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from headstart.build import build_runtime
from headstart.config import EngineSettings
from headstart.engine.errors import InvalidInput, ResourceExhausted
from headstart.engine.kv.memory import KVUsage
from headstart.engine.requests.candidates import CandidateParams
from headstart.engine.runtime import EngineRuntime
from headstart.engine.sessions.session import Session
from services.engine.checks import ReplicaChecks
from services.engine.data_registry import DataRegistry

POLICIES = ("headstart", "paper")


@dataclass(frozen=True)
class AttachResult:
    session: Session
    rebuilt: bool  # the replica did not hold the session: it was built from the snapshot


@dataclass(frozen=True)
class CoreInfo:
    holds_session: bool
    num_sessions: int
    num_attached: int
    num_queued: int
    seq: int = 0
    cached_tokens: int = 0
    kv: KVUsage | None = None  # the replica's KV bytes (used, shared, budget, free)
    num_data_sessions: int = 0  # data sessions (issue 12) open here
    data_kv_bytes: int = 0  # their live caches' bytes
    forward_tokens: int = 0  # tokens this replica's forwards have computed so far (its work)


class ReplicaCore:
    """Sessions of one replica. Admission: at most `max_attached` session
    streams at once (past it RESOURCE_EXHAUSTED), and the worker's bounded
    queue (`max_queued_jobs`, also RESOURCE_EXHAUSTED). Detached sessions stay
    cached until the runtime's LRU evicts them or the gateway closes them."""

    def __init__(self, settings: EngineSettings, max_attached: int | None = None, runtime: EngineRuntime | None = None):
        self.runtime = runtime or build_runtime(settings)
        self.max_attached = max_attached or settings.max_sessions
        self._attached: dict[str, int] = {}
        self._lock = threading.Lock()
        # data sessions (services/engine/data_service.py): on the same runtime, keyed apart from typing sessions
        self.data_sessions = DataRegistry(settings.max_sessions)
        # the checked answers' SQL runs (services/engine/checks.py): threads of their own
        self.checks = ReplicaChecks(settings.spider_dir)

    def can_attach(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._attached or len(self._attached) < self.max_attached

    def attach(self, session_id: str, db: str, policy: str = "headstart", tenant: str | None = None,
               candidates: CandidateParams | None = None) -> AttachResult:
        """Take a stream slot and return the session, building it when absent
        (its jobs carry `tenant`; its pauses decode `candidates`, None: the settings').

        Raises:
            InvalidInput: empty id or unknown policy.
            ResourceExhausted: `max_attached` streams are attached already, or
                the worker queue is full.
            SchemaError: unknown database.
        """
        if not session_id:
            raise InvalidInput("session_id is required")
        if policy not in POLICIES:
            raise InvalidInput(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
        with self._lock:
            if session_id not in self._attached and len(self._attached) >= self.max_attached:
                raise ResourceExhausted(f"replica full: {self.max_attached} sessions attached")
            self._attached[session_id] = self._attached.get(session_id, 0) + 1
        try:
            sessions = self.runtime.sessions
            if sessions.contains(session_id):
                session = sessions.get(session_id)
                if not session.closed:
                    return AttachResult(session, rebuilt=False)
            if not self.runtime.worker.can_enqueue():
                raise ResourceExhausted(f"forward queue full ({self.runtime.worker.max_queued} jobs)")
            return AttachResult(self.runtime.open_session(db, policy, session_id=session_id, tenant=tenant,
                                                          candidates=candidates), rebuilt=True)
        except BaseException:
            self.detach(session_id)
            raise

    def detach(self, session_id: str) -> None:
        """Give back the stream slot taken by `attach` (the session stays cached)."""
        with self._lock:
            count = self._attached.get(session_id, 0) - 1
            if count > 0:
                self._attached[session_id] = count
            else:
                self._attached.pop(session_id, None)

    def idle(self) -> bool:
        """No forward work queued or running (a moment to give memory back)."""
        worker = self.runtime.worker
        return worker.num_queued == 0 and not getattr(worker, "_running", ())

    def close(self, session_id: str) -> None:
        self.runtime.close_session(session_id)

    def info(self, session_id: str = "") -> CoreInfo:
        sessions = self.runtime.sessions
        holds = bool(session_id) and sessions.contains(session_id)
        seq = cached = 0
        if holds:
            seq, cached, _ = sessions.get(session_id).progress()
        with self._lock:
            attached = len(self._attached)
        worker = self.runtime.worker
        # NOTE: queued + running: a generation between two decode steps is
        # either; a client that left must see this fall to 0 (the work freed).
        busy = worker.num_queued + len(getattr(worker, "_running", ()))
        kv, num_data = self.kv_usage(), len(self.data_sessions)
        # NOTE: data sessions' bytes are the runtime's KVMemory accounting (headstart.data.budget), as typing ones'
        return CoreInfo(holds, len(sessions) + num_data, attached, busy, max(seq, 0), cached, kv, num_data,
                        kv.data_bytes, worker.forward_tokens)

    @property
    def num_attached(self) -> int:
        """Sessions with at least one stream attached."""
        with self._lock:
            return len(self._attached)

    def kv_usage(self) -> KVUsage:
        """KV bytes of this replica: its sessions, data sessions and stored P0 caches against the budget."""
        return self.runtime.sessions.kv_usage()

    def shutdown(self) -> None:
        self.data_sessions.close_all()
        self.checks.close()
        self.runtime.shutdown()
