"""`/healthz` and `/metrics` of the flash worker (Kubernetes probes, Prometheus).

`/healthz` is 200 while the worker's loop is turning (it last finished a
read within `stale_s`) and Redis answers; 503 otherwise. `/metrics` exposes
the worker's counters (`headstart_flash_*_total`) and the group's pending
entries, from the worker's own registry (no global state).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from headstart.data.live_store import LiveStoreError
from services.flash.worker import FlashWorker

COUNTERS = {
    "evaluations": "DataEvaluate calls (one per version entry with unanswered questions)",
    "questions_evaluated": "questions evaluated",
    "stored": "answers stored (each published as flash_ready)",
    "not_stored": "answers not stored (an answer as new was there already, or the question was deleted)",
    "skipped": "questions skipped: their stored answer is as new as the entry",
    "acked": "version entries acknowledged",
    "coalesced": "version entries acknowledged unanswered: a newer version of their session answers for them "
                 "(min_interval_ms, or acknowledged pushes behind them: max_coalesce_ms)",
    "retries": "entries left pending for a retry (session not held, replica unreachable)",
    "gave_up": "entries acknowledged unanswered after max_attempts",
    "failed": "evaluations that failed for good",
    "redis_errors": "Redis errors waited out",
}


class _WorkerCollector:
    def __init__(self, worker: FlashWorker):
        self.worker = worker

    def collect(self) -> Iterator:
        counts = dict(self.worker.counts)
        for name, help_text in COUNTERS.items():
            yield CounterMetricFamily(f"headstart_flash_{name}", help_text, value=counts.get(name, 0))
        try:
            pending = self.worker.store.num_pending_versions()
        except LiveStoreError:
            return
        yield GaugeMetricFamily("headstart_flash_pending_versions",
                                "version entries delivered and not acknowledged (all consumers)", value=pending)


class HealthServer:
    """Serves /healthz and /metrics on a daemon thread until `stop()`."""

    def __init__(self, worker: FlashWorker, host: str, port: int, alive: Callable[[], bool]):
        registry = CollectorRegistry()
        registry.register(_WorkerCollector(worker))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path == "/healthz":
                    ok = alive()
                    body, status, kind = (b"ok\n" if ok else b"stalled\n"), (200 if ok else 503), "text/plain"
                elif self.path == "/metrics":
                    body, status, kind = generate_latest(registry), 200, "text/plain; version=0.0.4"
                else:
                    body, status, kind = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # probes every few seconds: not worth a log line
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="flash-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def heartbeat(worker: FlashWorker, stale_s: float) -> Callable[[], bool]:
    """`alive()` for /healthz: the loop progressed within `stale_s` and Redis answers."""

    def alive() -> bool:
        if time.monotonic() - worker.last_progress > stale_s:
            return False
        try:
            return worker.store.ping()
        except LiveStoreError:
            return False

    return alive
