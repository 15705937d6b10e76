"""The one-shot completions a replica runs, by request id: so a cancellation sent as a call of its own reaches them.

Serve's gRPC proxy does not pass every client cancellation on to the
replica: a stream cancelled while the proxy is still routing it (the first
call through a cold proxy arrived 60 ms after it was sent) starts on the
replica anyway and runs to its end unread (issue 29: 521 of 521 tokens). So
the gateway, when its client leaves, also sends `CancelComplete(request_id)`,
routed like the Complete (metadata `session_id` is the request id). This
registry stops the request when it runs here, and when the cancellation
comes first it keeps a tombstone for `TOMBSTONE_S`, so the Complete that
arrives after it is refused (CANCELLED) before it queues any work.

Used on the replica's event loop; `started` may race a cancel from another
call, hence the lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from headstart.engine.requests.generation import GenerationRequest

TOMBSTONE_S = 60.0
MAX_TOMBSTONES = 10_000  # a flood of cancels for ids that never come cannot grow it without bound


class CompleteRegistry:
    """Running completions by request id, and the ids cancelled before they came."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._running: dict[str, GenerationRequest | None] = {}  # None: arrived, not queued yet
        self._cancelled: OrderedDict[str, float] = OrderedDict()  # request id -> when
        self._lock = threading.Lock()

    def begin(self, request_id: str) -> bool:
        """A Complete arrived; False when it was cancelled already (refuse it)."""
        with self._lock:
            self._expire()
            if self._cancelled.pop(request_id, None) is not None:
                return False
            self._running[request_id] = None
            return True

    def started(self, request_id: str, request: GenerationRequest) -> None:
        """Its request is queued: a cancel from now on stops it; one that came meanwhile stops it now."""
        with self._lock:
            cancelled = request_id not in self._running
            if not cancelled:
                self._running[request_id] = request
        if cancelled:
            request.cancel()

    def end(self, request_id: str) -> None:
        with self._lock:
            self._running.pop(request_id, None)

    def cancel(self, request_id: str) -> bool:
        """Stop `request_id`: True when it ran here; else remember it (its Complete is refused)."""
        with self._lock:
            if request_id in self._running:
                request = self._running.pop(request_id)
            else:
                self._expire()
                self._cancelled[request_id] = self._clock()
                while len(self._cancelled) > MAX_TOMBSTONES:
                    self._cancelled.popitem(last=False)
                return False
        if request is not None:
            request.cancel()
        return True

    def _expire(self) -> None:
        now = self._clock()
        while self._cancelled and now - next(iter(self._cancelled.values())) > TOMBSTONE_S:
            self._cancelled.popitem(last=False)
