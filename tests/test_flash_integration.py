"""The flash worker on real parts: a replica's DataService on a real gRPC server (random:tiny,
float64) publishing versions to a real Redis, and a DataSession in this process. Flash answers
equal the query path's on the same version (exact), are replaced on a new version and never
served stale; a session the replica does not hold is retried until it is reopened."""

from __future__ import annotations

import time
import uuid

import pytest

from headstart.data import DataSession, DataSettings
from headstart.data.live_store import LiveStore
from services.engine.data_events import VersionPublisher
from services.flash.evaluator import GrpcEvaluator, LocalEvaluator
from services.flash.worker import FlashWorker, WorkerConfig
from tests.test_engine_data import (  # noqa: F401 (db_root is a fixture)
    DEADLINE_S,
    SECRET,
    Replica,
    db_root,
    md,
    open_session,
    wait_version,
    wire_rows,
)
from headstart.v1 import engine_pb2

QUESTIONS = ("What is the average value per sensor?", "How many readings are there?")
MAX_NEW_TOKENS = 12


@pytest.fixture
def store(redis_url):
    s = LiveStore(redis_url, prefix=f"t{uuid.uuid4().hex[:12]}", socket_timeout_s=5.0)
    yield s
    s.close()


@pytest.fixture
def served(tiny_runtime, db_root, store):
    """A replica publishing its versions to `store`'s Redis and prefix, and a worker calling it by gRPC."""
    publisher = VersionPublisher(LiveStore(store.client, prefix=store.prefix))
    replica = Replica(tiny_runtime, db_root, publisher)
    evaluator = GrpcEvaluator(f"127.0.0.1:{replica.port}", "headstart-engine", SECRET, timeout_s=DEADLINE_S)
    worker = FlashWorker(store, evaluator, "w1", WorkerConfig(block_ms=0, retry_idle_ms=0,
                                                              max_new_tokens=MAX_NEW_TOKENS))
    yield replica, publisher, worker
    evaluator.close()
    replica.stop()
    publisher.close()


def settle(worker: FlashWorker, publisher: VersionPublisher | None, sid: str, version: int) -> None:
    """Run the worker until the session's version is published and every entry is handled."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        if publisher is not None:
            assert publisher.flush(DEADLINE_S)
        worker.step()
        if worker.store.current_version(sid) >= version and worker.store.num_pending_versions() == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"version {worker.store.current_version(sid)}, waited for {version}")


def query(stub, sid: str, question: str) -> engine_pb2.DataAnswer:
    return stub.DataQuery(engine_pb2.DataQueryRequest(session_id=sid, question=question, max_new_tokens=MAX_NEW_TOKENS,
                                                      execute=True), metadata=md(), timeout=DEADLINE_S)


def test_grpc_replica_flash_answers_are_exact_replaced_and_never_stale(served):
    replica, publisher, worker = served
    store, stub, sid = worker.store, replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid, retention="rebuild", retention_tokens=512)
    qids = [store.register_flash(sid, q) for q in QUESTIONS]
    for version, start in ((3, 0), (5, 3)):
        stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(start, version - start)),
                      metadata=md(), timeout=DEADLINE_S)
        wait_version(stub, sid, version)
        settle(worker, publisher, sid, version)
        assert store.current_version(sid) == version
        for qid, question in zip(qids, QUESTIONS):
            stored = store.lookup(sid, question, version)
            asked = query(stub, sid, question)  # the model path on the same version
            assert asked.version == version and stored is not None
            assert (stored["version"], stored["text"], stored["sql"], stored["error"]) == \
                (version, asked.text, asked.sql, asked.error)
            assert stored["logit_gap"] == pytest.approx(asked.logit_gap) and stored["id"] == qid
        if version == 5:  # the answers of version 3 were replaced: never served again
            assert [store.lookup(sid, q, 3) for q in QUESTIONS] == [None, None]
            assert [store.answer(sid, q)["version"] for q in qids] == [5, 5]
    ready = [(e.payload["id"], e.payload["version"]) for e in store.events_after(sid, None) if e.kind == "flash_ready"]
    assert sorted(ready) == sorted((q, v) for q in qids for v in (3, 5))  # once per answer stored
    assert worker.counts["retries"] == 0 and worker.counts["failed"] == 0


def test_a_session_the_replica_lost_is_retried_until_reopened(served):
    replica, publisher, worker = served
    store, stub, sid = worker.store, replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid)
    qid = store.register_flash(sid, QUESTIONS[1])
    rows = wire_rows(0, 2)
    stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=rows), metadata=md(), timeout=DEADLINE_S)
    wait_version(stub, sid, 2)
    assert publisher.flush(DEADLINE_S)
    # the replica loses the session before the worker gets to it (as after a replica restart)
    stub.DataClose(engine_pb2.DataRef(session_id=sid), metadata=md(), timeout=DEADLINE_S)
    worker.step()
    assert worker.counts["retries"] >= 1 and store.num_pending_versions() >= 1 and store.answer(sid, qid) is None
    open_session(stub, sid, rows=rows)  # the gateway reopens it from the rows log: same version
    settle(worker, None, sid, 2)
    assert store.lookup(sid, QUESTIONS[1], 2)["text"] == query(stub, sid, QUESTIONS[1]).text


def test_local_evaluator_on_a_data_session(tiny_runtime, db_root, store):
    sid = "d-" + uuid.uuid4().hex
    publisher = VersionPublisher(LiveStore(store.client, prefix=store.prefix))
    session = DataSession(tiny_runtime, str(db_root / "readings.sqlite"), DataSettings(max_row_tokens=40),
                          session_id=sid, tenant="alice", on_version=publisher.listener(sid, "alice"))
    try:
        qids = [store.register_flash(sid, q) for q in QUESTIONS]
        worker = FlashWorker(store, LocalEvaluator({sid: session}), "local",
                             WorkerConfig(block_ms=0, max_new_tokens=MAX_NEW_TOKENS))
        session.push([{"table": "readings", "values": {"id": 100 + i, "sensor": f"s{i}", "value": 1.5 * i,
                                                        "ts": f"t{i}"}} for i in range(3)])
        session.wait_idle()
        settle(worker, publisher, sid, session.data_version)
        version = session.data_version
        for qid, question in zip(qids, QUESTIONS):
            stored = store.lookup(sid, question, version)
            asked = session.query(question, max_new_tokens=MAX_NEW_TOKENS)
            assert stored is not None and asked.data_version == version
            assert (stored["text"], stored["sql"]) == (asked.text, asked.sql)  # exact
        assert worker.counts["evaluations"] >= 1
    finally:
        session.close()
        publisher.close()
