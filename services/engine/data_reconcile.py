"""A replica's data sessions against Redis: drop the caches whose session no longer exists.

A data session lives in Redis (its meta, rows log, questions: the gateway's)
and, while it is used, as a live cache on one replica. The gateway closes
both together; but a Redis that comes back without the session (restarted
without its data, flushed, a failover to an empty replica) leaves the cache
on the replica, counted against its data-session share and its KV budget,
with nothing that would ever free it (issue 29: 240 KiB of KV stranded on
two replicas). The reconciler checks every `period_s` (and at once when
Redis answers again after an outage) that each session the replica holds
still has its meta in Redis, and closes the ones that have none.

A session is never dropped while Redis cannot be reached (absent is not
unknown), and the gateway writes a session's meta before it opens it on a
replica and deletes it only after the replica closed it, so a live session
is never taken for a lost one.
"""

from __future__ import annotations

import logging
import threading

from services.engine.data_registry import DataRegistry

log = logging.getLogger(__name__)
PERIOD_S = 5.0


class DataReconciler:
    """Runs `reconcile()` on a thread of its own every `period_s`.

    Args:
        registry: the replica's data sessions.
        store: a `LiveStore` on the data API's Redis (anything with `key` and a `client`).
    """

    def __init__(self, registry: DataRegistry, store, period_s: float = PERIOD_S):
        self.registry, self.store, self.period_s = registry, store, period_s
        self.dropped = 0  # sessions closed because Redis no longer had them
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="headstart-data-reconcile", daemon=True)
        self._thread.start()

    def reconcile(self) -> list[str]:
        """Close the held sessions Redis has no meta for; their ids. Raises redis errors (unreachable)."""
        sessions = self.registry.sessions()
        if not sessions:
            return []
        pipe = self.store.client.pipeline(transaction=False)
        for session in sessions:
            pipe.exists(self.store.key(session.id, "meta"))
        gone = [s for s, exists in zip(sessions, pipe.execute()) if not exists]
        for session in gone:
            if self.registry.pop(session.id, session.tenant) is session:
                log.warning("data session %s is gone from Redis: its cache on this replica is dropped", session.id)
                session.close()
                self.dropped += 1
        return [s.id for s in gone]

    def _run(self) -> None:
        reachable = True
        while not self._stop.wait(self.period_s if reachable else min(1.0, self.period_s)):
            try:
                self.reconcile()
            except Exception as exc:  # Redis away: nothing is dropped; look again sooner, at once when it is back
                if reachable:
                    log.warning("data sessions not reconciled (Redis unreachable): %s", exc)
                reachable = False
                continue
            if not reachable:
                log.info("Redis is back: data sessions reconciled")
            reachable = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
