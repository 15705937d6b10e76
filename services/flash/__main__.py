"""`python -m services.flash`: run the flash worker until SIGTERM/SIGINT.

Settings come from the environment (`HEADSTART_FLASH_*`, see settings.py;
Redis from `HEADSTART_REDIS_URL` when the worker's own is unset). The
consumer name defaults to the host name, so a restarted pod of a StatefulSet
or a restarted process resumes its own pending entries at once; entries of a
Deployment pod that is gone are taken over after `claim_idle_ms`.
"""

from __future__ import annotations

import logging
import signal
import threading

from headstart.data.live_store import LiveStore
from services.engine.guard import configured_secret
from services.flash.evaluator import GrpcEvaluator
from services.flash.health import HealthServer, heartbeat
from services.flash.settings import FlashSettings
from services.flash.worker import FlashWorker, WorkerConfig


def build_worker(settings: FlashSettings) -> FlashWorker:
    """The worker the settings describe, on the engine's DataEvaluate."""
    store = LiveStore(settings.resolved_redis_url(), prefix=settings.redis_prefix)
    evaluator = GrpcEvaluator(settings.engine_target, settings.engine_app,
                              configured_secret(settings.engine_secret) or "", settings.evaluate_timeout_s)
    config = WorkerConfig(max_new_tokens=settings.max_new_tokens, batch=settings.batch,
                          claim_idle_ms=settings.claim_idle_ms, retry_idle_ms=settings.retry_idle_ms,
                          max_attempts=settings.max_attempts, max_answer_rows=settings.max_answer_rows,
                          min_interval_ms=settings.min_interval_ms, max_coalesce_ms=settings.max_coalesce_ms)
    return FlashWorker(store, evaluator, settings.consumer_name(), config)


def main() -> None:
    settings = FlashSettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        worker = build_worker(settings)
    except ValueError as exc:  # no Redis configured: say so, no traceback
        raise SystemExit(f"flash worker: {exc}") from None
    # one stuck evaluation per entry of a batch, plus the read's own wait
    stale_s = settings.evaluate_timeout_s * settings.batch + 30.0
    health = HealthServer(worker, settings.health_host, settings.health_port, heartbeat(worker, stale_s))
    logging.getLogger("services.flash").info(
        "flash worker %s: versions from %s, engine %s, health on :%d", worker.consumer,
        worker.store.versions_key, settings.engine_target, health.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        worker.run(stop)
    finally:
        health.stop()
        worker.evaluator.close()
        worker.store.close()


if __name__ == "__main__":
    main()
