"""Integration: the flash worker on the real stack (real Redis, real Ray Serve with 2
random:tiny float64 replicas behind Serve's gRPC proxy, the real gateway).

A question registered through the gateway is answered by the worker through Serve's
sticky router, token-exact against a cold prefill; the gateway then serves it as
`source: "flash"` until the data moves on, never stale. A worker process SIGKILLed
mid-entry and restarted on the real engine loses no entry and stores nothing twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from headstart.data.live_store import LiveStore
from services.flash.evaluator import GrpcEvaluator
from services.flash.worker import FlashWorker, WorkerConfig
from services.gateway.sessions import engine_session_id
from tests.flash_fakes import evaluations
from tests.test_gateway_data import (  # noqa: F401 (http, prompt: fixtures)
    ALICE,
    MAX_NEW,
    QUESTION,
    cities,
    cold_text,
    http,
    ok,
    open_data,
    prompt,
    wait_ingested,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 120.0


@pytest.fixture
def store(serve_engine):
    """The live store the replicas and the gateway use (prefix "hs")."""
    s = LiveStore(serve_engine.redis_url)
    yield s
    s.close()


def push(http, sid: str, rows: list[dict]) -> int:
    """Push rows through the gateway; the data version once they are all ingested."""
    seqs = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": rows}, headers=ALICE))["seqs"]
    return wait_ingested(http, sid, seqs[-1])["data_version"]


def settle(worker: FlashWorker, eid: str, qid: str, version: int) -> None:
    """Run the worker until the question's answer is at `version` or newer."""
    deadline = time.monotonic() + DEADLINE_S
    while worker.store.answer_versions(eid).get(qid, 0) < version:
        worker.step()
        assert time.monotonic() < deadline, f"answers {worker.store.answer_versions(eid)}, waited for {version}"


def test_flash_answer_through_serve_is_exact_and_served_by_the_gateway(serve_engine, http, prompt, tiny_runtime,
                                                                      store):
    sid = open_data(http)
    eid = engine_session_id("alice", sid)
    qid = ok(http.post(f"/v1/data/{sid}/flash", json={"question": QUESTION}, headers=ALICE))["id"]
    evaluator = GrpcEvaluator(serve_engine.grpc_target, serve_engine.app_name, serve_engine.secret)
    worker = FlashWorker(store, evaluator, f"serve-{uuid.uuid4().hex[:8]}",
                         WorkerConfig(block_ms=100, max_new_tokens=MAX_NEW))
    pushed: list[dict] = []
    try:
        for n in (3, 2):
            rows = cities(n)
            pushed += rows
            version = push(http, sid, rows)
            settle(worker, eid, qid, version)
            stored = store.answer(eid, qid)
            assert stored["version"] == version
            assert stored["text"] == cold_text(tiny_runtime, prompt, pushed, QUESTION)  # exact
            served = ok(http.post(f"/v1/data/{sid}/query", json={"question": QUESTION, "max_new_tokens": MAX_NEW},
                                  headers=ALICE))
            assert (served["source"], served["version"], served["text"]) == ("flash", version, stored["text"])
        # new rows, answer not computed yet: the gateway asks the model, never the stale answer
        rows = cities(2)
        pushed += rows
        version = push(http, sid, rows)
        served = ok(http.post(f"/v1/data/{sid}/query", json={"question": QUESTION, "max_new_tokens": MAX_NEW},
                              headers=ALICE))
        assert (served["source"], served["version"]) == ("model", version)
        assert served["text"] == cold_text(tiny_runtime, prompt, pushed, QUESTION)
        ready = [e.payload["version"] for e in store.events_after(eid, None, count=10_000) if e.kind == "flash_ready"]
        assert len(ready) == len(set(ready)) == 2  # one flash_ready per stored answer
    finally:
        evaluator.close()
        ok(http.delete(f"/v1/data/{sid}", headers=ALICE))


def run_worker(serve_engine, consumer: str, crash_at: str = "") -> int:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}{os.pathsep}{ROOT}",
           "HEADSTART_ENGINE_SECRET": serve_engine.secret}
    args = [sys.executable, "-m", "tests.flash_fakes", serve_engine.redis_url, "hs", consumer,
            "--engine", serve_engine.grpc_target, "--app", serve_engine.app_name, "--max-new-tokens", str(MAX_NEW)]
    if crash_at:
        args += ["--crash-at", crash_at]
    return subprocess.run(args, cwd=ROOT, env=env, timeout=600).returncode


@pytest.mark.parametrize("stage", ["stored", "evaluated"])
def test_worker_killed_on_the_real_engine_loses_nothing_and_stores_once(serve_engine, http, prompt, tiny_runtime,
                                                                        store, stage):
    sid = open_data(http)
    eid = engine_session_id("alice", sid)
    qid = ok(http.post(f"/v1/data/{sid}/flash", json={"question": QUESTION}, headers=ALICE))["id"]
    consumer = f"kill-{uuid.uuid4().hex[:8]}"
    try:
        pushed = cities(2)
        first = push(http, sid, pushed)
        rows = cities(2)
        pushed += rows
        second = push(http, sid, rows)
        # the live cache is at `second`: the first entry's evaluation answers at `second`,
        # then the process dies before acknowledging it
        assert run_worker(serve_engine, consumer, f"{stage}:{first}:{eid}") == -signal.SIGKILL
        assert run_worker(serve_engine, consumer) == 0  # restarted under the same name
        mine = {k: v for k, v in evaluations(store).items() if k.startswith(eid + ":")}
        # killed after storing: the restart skips both entries; before: it evaluates again, stores once
        assert mine == {f"{eid}:{second}": 1 if stage == "stored" else 2}
        assert store.answer(eid, qid)["version"] == second
        assert store.answer(eid, qid)["text"] == cold_text(tiny_runtime, prompt, pushed, QUESTION)
        rows = cities(1)
        pushed += rows
        third = push(http, sid, rows)
        assert run_worker(serve_engine, consumer) == 0
        assert store.answer(eid, qid)["version"] == third
        ready = [e.payload["version"] for e in store.events_after(eid, None, count=10_000) if e.kind == "flash_ready"]
        assert ready == [second, third]  # each stored answer announced once, none lost
        assert store.num_pending_versions() == 0
    finally:
        ok(http.delete(f"/v1/data/{sid}", headers=ALICE))
