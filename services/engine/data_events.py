"""Data-version (and failure) events of a replica's data sessions, published to Redis.

A `DataSession` calls `on_version(VersionEvent)` on the forward worker's
thread after each committed ingestion batch, and `on_failure(reason)` once
if it fails. That thread must never wait on Redis, so
`VersionPublisher.submit` only appends to a queue; one publisher thread per
replica drains it in order: a version with `LiveStore.publish_version`
(headstart.data.live_store: the session's current version, the global
versions stream the flash worker consumes, the session's `data_updated`
event), a failure as the session's `session_failed` event.

Delivery: while Redis answers, every event is published, in order. When
Redis cannot be reached the event is kept and retried (backoff up to
`MAX_BACKOFF_S`); events that arrive meanwhile queue behind it up to
`max_pending`, past which the oldest are dropped and counted (`dropped`),
never silently: versions are monotonic, so the newest event of a session is
the one a flash worker needs. An event Redis refuses (an error other than
UNAVAILABLE) is retried `MAX_REFUSALS` times, then dropped and counted, so
one bad event cannot stop the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 2.0
MAX_REFUSALS = 5
DEFAULT_MAX_PENDING = 10_000


@dataclass(frozen=True)
class PendingVersion:
    """One version event of one session, waiting for Redis."""

    session_id: str
    tenant: str
    version: int
    rows_added: int
    dropped_total: int
    lag_versions: int = 0  # acknowledged pushes still behind this version (headstart.data.lag)
    lag_seconds: float = 0.0

    def publish(self, store) -> None:
        lag = {"lag_versions": self.lag_versions, "lag_seconds": self.lag_seconds} if self.lag_versions else {}
        store.publish_version(self.session_id, self.tenant, self.version, self.rows_added, self.dropped_total, **lag)


@dataclass(frozen=True)
class PendingFailure:
    """A session that failed (`DataState.FAILED`): its `session_failed` event, waiting for Redis."""

    session_id: str
    reason: str
    version: int = 0  # logged beside the versions when it cannot be published

    def publish(self, store) -> None:
        store.mark_failed(self.session_id, self.reason)


class VersionPublisher:
    """Publishes version events from a queue on its own thread.

    Args:
        store: a `LiveStore` (anything with `publish_version(sid, tenant,
            version, rows_added, dropped_total)`).
    """

    def __init__(self, store, max_pending: int = DEFAULT_MAX_PENDING):
        self.store = store
        self.max_pending = max_pending
        self.published = self.dropped = self.failures = 0
        self._pending: deque[PendingVersion] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="headstart-data-versions", daemon=True)
        self._thread.start()

    @classmethod
    def from_url(cls, redis_url: str, prefix: str = "hs") -> VersionPublisher:
        from headstart.data.live_store import LiveStore

        return cls(LiveStore(redis_url, prefix=prefix))

    def listener(self, session_id: str, tenant: str | None):
        """The `on_version` callback of one session: queues its events (never blocks)."""
        def on_version(event) -> None:
            self.submit(PendingVersion(session_id, tenant or "", int(event.version), int(event.rows_added),
                                       int(event.dropped_total), int(event.lag_versions),
                                       float(event.lag_seconds)))

        return on_version

    def failure_listener(self, session_id: str):
        """The `on_failure` callback of one session: queues its `session_failed` event (never blocks)."""
        return lambda reason: self.submit(PendingFailure(session_id, str(reason)))

    def submit(self, event: PendingVersion | PendingFailure) -> None:
        with self._cond:
            self._pending.append(event)
            while len(self._pending) > self.max_pending:
                self._pending.popleft()
                self.dropped += 1
            self._cond.notify_all()

    @property
    def num_pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the queue is empty (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Publish what is queued (for up to `timeout` s), then stop the thread."""
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    def _run(self) -> None:
        backoff, refusals = 0.0, 0
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                event = self._pending[0]  # NOTE: peeked, removed only once Redis took it
            try:
                event.publish(self.store)
            except Exception as exc:
                self.failures += 1
                # LiveStoreUnavailable (code UNAVAILABLE): Redis is away, keep the event; else Redis refused it
                refusals += getattr(exc, "code", "UNAVAILABLE") != "UNAVAILABLE"
                if refusals >= MAX_REFUSALS:
                    log.error("data version %s of %s dropped: %s", event.version, event.session_id, exc)
                    self._done(event, published=False)
                    backoff, refusals = 0.0, 0
                    continue
                backoff = min(MAX_BACKOFF_S, backoff * 2 or 0.05)
                log.warning("data version %s of %s not published (retry in %.2f s): %s", event.version,
                            event.session_id, backoff, exc)
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, backoff)
                continue
            backoff, refusals = 0.0, 0
            self._done(event, published=True)

    def _done(self, event: PendingVersion | PendingFailure, published: bool) -> None:
        with self._cond:
            if self._pending and self._pending[0] is event:  # not pushed out meanwhile by max_pending
                self._pending.popleft()
                if not published:
                    self.dropped += 1
            if published:
                self.published += 1
            self._cond.notify_all()
