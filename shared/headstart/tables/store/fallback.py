"""`FallbackStore`: a store whose failures become misses, so requests never fail on it.

When Redis is down or returns garbage, the engine must compute the table
instead of failing the request. This wrapper catches every exception of the
wrapped store, logs it (at most once per `retry_after_s`), counts it, and
answers as if the block were absent: `get` -> None, `contains` -> False,
`list` -> [], `put`/`delete` -> dropped.

After a failure it stops calling the wrapped store for `retry_after_s`
seconds (a circuit breaker): an unreachable server would otherwise cost a
connect timeout on every lookup of every request. The first call after the
pause tries again; a success closes the circuit.

Counters: `num_errors` (calls that failed), `num_skipped` (calls answered as
a miss without trying while the circuit was open).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from headstart.tables.block import TableBlock
from headstart.tables.keys import BlockId, BlockScope
from headstart.tables.store.base import BlockStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class FallbackStore(BlockStore):
    """Wraps `inner` so that errors degrade to misses (see module docstring).

    Args:
        inner: the store to protect (usually a `RedisStore`).
        retry_after_s: how long to answer misses without trying after a failure.
        clock: monotonic seconds; injectable for tests.
    """

    def __init__(
        self,
        inner: BlockStore,
        *,
        retry_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._open_until: float | None = None
        self._lock = threading.Lock()
        self.num_errors = 0
        self.num_skipped = 0

    @property
    def is_open(self) -> bool:
        """True while failures pause calls to the wrapped store."""
        with self._lock:
            return self._open_until is not None and self._clock() < self._open_until

    def _call(self, what: str, fn: Callable[[], T], default: T) -> T:
        with self._lock:
            if self._open_until is not None and self._clock() < self._open_until:
                self.num_skipped += 1
                return default
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - any store failure must become a miss
            with self._lock:
                self.num_errors += 1
                was_closed = self._open_until is None
                self._open_until = self._clock() + self.retry_after_s
            if was_closed:
                log.warning("block store %s failed on %s, serving misses for %.1fs: %r",
                            self.url, what, self.retry_after_s, exc)
            return default
        with self._lock:
            if self._open_until is not None:
                log.info("block store %s is back", self.url)
            self._open_until = None
        return result

    def get(self, block_id: BlockId) -> TableBlock | None:
        return self._call("get", lambda: self.inner.get(block_id), None)

    def put(self, block: TableBlock) -> None:
        self._call("put", lambda: self.inner.put(block), None)

    def delete(self, block_id: BlockId) -> bool:
        return self._call("delete", lambda: self.inner.delete(block_id), False)

    def contains(self, block_id: BlockId) -> bool:
        return self._call("contains", lambda: self.inner.contains(block_id), False)

    def list(self, scope: BlockScope) -> list[str]:
        return self._call("list", lambda: self.inner.list(scope), [])

    def close(self) -> None:
        try:
            self.inner.close()
        except Exception as exc:  # noqa: BLE001 - closing a dead connection is not an error
            log.info("closing block store %s: %r", self.url, exc)
