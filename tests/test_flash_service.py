"""`python -m services.flash` as its own process, configured from the environment only (as its
Helm Deployment is): it answers a replica's data session over gRPC, serves /healthz and
/metrics, and stops cleanly on SIGTERM; without Redis it refuses to start, saying why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import redis

from headstart.data.live_store import LiveStore
from headstart.redis_server import free_port
from headstart.v1 import engine_pb2
from services.engine.data_events import VersionPublisher
from tests.test_engine_data import DEADLINE_S, SECRET, Replica, db_root, md, open_session, wait_version, wire_rows  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "How many readings are there?"


def worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADSTART_")}
    env["PYTHONPATH"] = f"{ROOT / 'shared'}{os.pathsep}{ROOT}"
    return {**env, **extra}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def wait_for(check, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not (result := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)  # polling another process
    return result


def test_worker_process_answers_serves_health_and_stops(tiny_runtime, db_root, redis_url):
    prefix = f"t{uuid.uuid4().hex[:12]}"
    store = LiveStore(redis_url, prefix=prefix)
    publisher = VersionPublisher(LiveStore(store.client, prefix=prefix))
    replica = Replica(tiny_runtime, db_root, publisher)
    health = free_port()
    env = worker_env(HEADSTART_REDIS_URL=redis_url, HEADSTART_FLASH_REDIS_PREFIX=prefix,
                     HEADSTART_FLASH_ENGINE_TARGET=f"127.0.0.1:{replica.port}", HEADSTART_ENGINE_SECRET=SECRET,
                     HEADSTART_FLASH_HEALTH_HOST="127.0.0.1", HEADSTART_FLASH_HEALTH_PORT=str(health),
                     HEADSTART_FLASH_CONSUMER="svc-1", HEADSTART_FLASH_MAX_NEW_TOKENS="8")
    process = subprocess.Popen([sys.executable, "-m", "services.flash"], cwd=ROOT, env=env)
    try:
        sid = "d-" + uuid.uuid4().hex
        open_session(replica.stub, sid)
        qid = store.register_flash(sid, QUESTION)
        replica.stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 3)), metadata=md(),
                              timeout=DEADLINE_S)
        wait_version(replica.stub, sid, 3)
        assert publisher.flush(DEADLINE_S)
        answer = wait_for(lambda: store.lookup(sid, QUESTION, 3), "the worker's answer")
        asked = replica.stub.DataQuery(engine_pb2.DataQueryRequest(session_id=sid, question=QUESTION,
                                                                   max_new_tokens=8), metadata=md(), timeout=DEADLINE_S)
        assert (answer["id"], answer["text"]) == (qid, asked.text)
        assert get(f"http://127.0.0.1:{health}/healthz") == (200, "ok\n")
        _, metrics = wait_for(lambda: (m := get(f"http://127.0.0.1:{health}/metrics"))[0] == 200
                              and "headstart_flash_acked_total 1.0" in m[1] and m, "the acked entry in /metrics")
        assert "headstart_flash_stored_total 1.0" in metrics
        assert "headstart_flash_pending_versions 0.0" in metrics
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        replica.stop()
        publisher.close()
        store.close()


def test_without_redis_it_refuses_to_start():
    done = subprocess.run([sys.executable, "-m", "services.flash"], cwd=ROOT, env=worker_env(),
                          capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode != 0 and "HEADSTART_REDIS_URL" in done.stderr


def test_local_stack_worker_joins_the_group_and_stops_on_terminate(redis_url):
    """`headstart serve`'s child worker (services/flash/local.py)."""
    from services.flash.local import start_local_worker

    prefix, consumer = f"t{uuid.uuid4().hex[:12]}", f"local-{uuid.uuid4().hex[:6]}"
    store = LiveStore(redis_url, prefix=prefix)
    worker = start_local_worker(redis_url, "127.0.0.1:1", "headstart-engine", "s3cret", consumer=consumer,
                                prefix=prefix)
    try:
        def joined() -> bool:
            try:
                groups = store.client.xinfo_consumers(store.versions_key, "flash")
            except redis.ResponseError:  # the group is created by the worker's first read
                return False
            return consumer in {(c["name"].decode() if isinstance(c["name"], bytes) else c["name"]) for c in groups}

        wait_for(joined, "the worker's first read")
        assert worker.is_running
        worker.stop()
        assert worker.process.returncode == 0 and not worker.is_running
    finally:
        worker.stop()
        store.close()
