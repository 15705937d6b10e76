"""The replica's data-session RPCs (services/engine/data_service.py) on a real
gRPC server in this process, over a real runtime (random:tiny, float64):
each RPC and its errors, tenant isolation, a rebuild from rows giving the
same version and the same answer, version events in a real Redis."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from dataclasses import replace

import grpc
import pytest

from headstart.client.errors import CODE_METADATA_KEY
from headstart.schema.catalogue import Catalogue
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.core import ReplicaCore
from services.engine.data_events import VersionPublisher
from services.engine.data_registry import NOT_HELD
from services.engine.data_service import DataService
from services.engine.guard import SECRET_METADATA_KEY, TENANT_METADATA_KEY, EngineGuard
from services.engine.loader import SchemaLoader

SECRET = "data-test-secret"
QUESTION = "What is the average value per sensor?"
DEADLINE_S = 60.0


class _Servicer(engine_pb2_grpc.EngineServicer):
    """The Engine service with its data methods answered by a DataService (as the deployment does)."""

    def __init__(self, data: DataService):
        for name in ("DataOpen", "DataPush", "DataQuery", "DataEvaluate", "DataDescribe", "DataClose"):
            setattr(self, name, getattr(data, name))


class Replica:
    """A DataService on a grpc.aio server (port 0) whose loop runs on a thread of its own."""

    def __init__(self, runtime, db_root, publisher=None):
        self.core = ReplicaCore(runtime.settings, runtime=runtime)
        guard = EngineGuard(SECRET, Catalogue(sqlite_roots=[db_root], include_spider=False))
        loader = SchemaLoader(runtime.prompt_for)

        async def prepare(db: str) -> str:
            spec = guard.spec(db)
            await loader.ensure(spec, db)
            return spec

        self.data = DataService(self.core, "replica-test", guard, prepare, publisher)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = engine_pb2_grpc.EngineStub(self.channel)
        self._loader = loader

    async def _start(self) -> int:
        self.server = grpc.aio.server()
        engine_pb2_grpc.add_EngineServicer_to_server(_Servicer(self.data), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    def stop(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.server.stop(None), self.loop).result(30)
        self.data.shutdown()
        self.core.data_sessions.close_all()
        self._loader.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def md(tenant: str | None = "alice", secret: str = SECRET) -> tuple:
    out = ((SECRET_METADATA_KEY, secret),)
    return out + (((TENANT_METADATA_KEY, tenant),) if tenant else ())


def wire_rows(start: int, n: int, with_seq: bool = True) -> list[engine_pb2.DataRowWire]:
    return [engine_pb2.DataRowWire(seq=(i + 1) if with_seq else 0, table="readings", values_json=json.dumps(
        {"id": 100 + i, "sensor": f"s{i % 3}", "value": 1.25 * i, "ts": f"t{i}"})) for i in range(start, start + n)]


@pytest.fixture(scope="module")
def db_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data-dbs")
    with sqlite3.connect(root / "readings.sqlite") as conn:
        conn.execute("CREATE TABLE readings (id INTEGER PRIMARY KEY, sensor TEXT NOT NULL, value REAL, ts TEXT)")
        conn.execute("INSERT INTO readings VALUES (1, 'seed', 0.5, 't0')")
    conn.close()
    return root


@pytest.fixture
def replica(tiny_runtime, db_root):
    rep = Replica(tiny_runtime, db_root)
    yield rep
    rep.stop()


def open_session(stub, sid: str, rows=(), tenant: str | None = "alice", **settings) -> engine_pb2.DataInfo:
    request = engine_pb2.DataOpenRequest(session_id=sid, db="readings", tenant=tenant or "",
                                         settings=engine_pb2.DataSettingsWire(**settings), rows=list(rows))
    return stub.DataOpen(request, metadata=md(tenant), timeout=DEADLINE_S)


def wait_version(stub, sid: str, version: int, tenant: str = "alice") -> engine_pb2.DataInfo:
    """Describe until the session's data version is `version` (ingestion runs in the background)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        info = stub.DataDescribe(engine_pb2.DataRef(session_id=sid), metadata=md(tenant), timeout=DEADLINE_S)
        steady = json.loads(info.describe_json).get("retention_state", "steady") == "steady"
        if info.version >= version and info.buffered == 0 and steady:  # no rebuild in flight
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"version {info.version}, waited for {version}")
        time.sleep(0.02)


def query(stub, sid: str, question: str = QUESTION, tenant: str = "alice", execute: bool = False):
    return stub.DataQuery(engine_pb2.DataQueryRequest(session_id=sid, question=question, max_new_tokens=12,
                                                      execute=execute), metadata=md(tenant), timeout=DEADLINE_S)


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_open_push_query_describe_close(replica):
    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    opened = open_session(stub, sid, retention="rebuild", retention_tokens=512)
    assert (opened.holds, opened.version, opened.rows_in_cache, opened.retention) == (True, 0, 0, "rebuild")
    assert opened.replica == "replica-test" and json.loads(opened.describe_json)["id"] == sid
    again = open_session(stub, sid)  # the replica holds it: unchanged, not rebuilt
    assert (again.holds, again.version) == (True, 0)

    ack = stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 4)), metadata=md(),
                        timeout=DEADLINE_S)
    assert (list(ack.seqs), ack.dropped, ack.dropped_total) == ([1, 2, 3, 4], 0, 0)
    info = wait_version(stub, sid, 4)
    assert (info.version, info.rows_in_cache, info.dropped_total) == (4, 4, 0)
    assert info.cache_tokens > info.sliding_tokens > 0

    answer = query(stub, sid, execute=True)
    assert answer.version == 4 and answer.question == QUESTION and answer.text
    assert answer.logit_gap > 0 and answer.ms > 0 and not answer.speculative
    # random:tiny writes no valid SQL: the execution's error is reported, no rows
    assert answer.error and json.loads(answer.rows_json) == []

    described = replica.core.info()
    assert (described.num_data_sessions, described.num_sessions >= 1) == (1, True)
    assert described.data_kv_bytes > 0

    closed = stub.DataClose(engine_pb2.DataRef(session_id=sid), metadata=md(), timeout=DEADLINE_S)
    assert (closed.holds, closed.version) == (False, 4)
    assert replica.core.info().num_data_sessions == 0
    again = stub.DataClose(engine_pb2.DataRef(session_id=sid), metadata=md(), timeout=DEADLINE_S)
    assert again.holds is False  # idempotent
    err = rpc_error(lambda: query(stub, sid))
    assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, NOT_HELD)


def test_query_executes_at_the_answer_version(replica, monkeypatch):
    """execute runs the answer's SQL on the working copy as of the answer's version."""
    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid)
    stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 3)), metadata=md(), timeout=DEADLINE_S)
    wait_version(stub, sid, 3)
    session = replica.core.data_sessions.get(sid, "alice")
    real_query = session.query
    # NOTE: the model's text stands in for a model that writes SQL; execution stays real
    monkeypatch.setattr(session, "query", lambda *a, **k: replace(
        real_query(*a, **k), sql="SELECT count(*), max(id) FROM readings"))
    answer = query(stub, sid, execute=True)
    assert (answer.version, answer.error, list(answer.columns)) == (3, "", ["count(*)", "max(id)"])
    assert json.loads(answer.rows_json) == [[4, 102]]  # the seed row + 3 pushed


def test_errors_are_grpc_statuses(replica):
    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid)
    bad = wire_rows(0, 3)
    bad[1].values_json = json.dumps({"id": 7, "sensor": "s", "nope": 1})
    err = rpc_error(lambda: stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=bad), metadata=md()))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "row 1" in err.details()
    assert dict(err.trailing_metadata())[CODE_METADATA_KEY] == "INVALID_ARGUMENT"
    bad[1].values_json = "{not json"
    err = rpc_error(lambda: stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=bad), metadata=md()))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "row 1" in err.details()
    mixed = wire_rows(0, 2)
    mixed[1].seq = 0
    err = rpc_error(lambda: stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=mixed), metadata=md()))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    # nothing of the refused pushes went in: the session is still usable
    ack = stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 2)), metadata=md())
    assert list(ack.seqs) == [1, 2] and wait_version(stub, sid, 2).rows_in_cache == 2

    for call in (lambda: query(stub, "d-unknown"),
                 lambda: stub.DataDescribe(engine_pb2.DataRef(session_id="d-unknown"), metadata=md()),
                 lambda: stub.DataPush(engine_pb2.DataPushRequest(session_id="d-unknown", rows=wire_rows(0, 1)),
                                       metadata=md())):
        err = rpc_error(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, NOT_HELD)
    err = rpc_error(lambda: stub.DataDescribe(engine_pb2.DataRef(session_id=sid), metadata=md(secret="wrong")))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    err = rpc_error(lambda: open_session(stub, "d-x", retention="sideways"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "retention" in err.details()
    err = rpc_error(lambda: stub.DataOpen(engine_pb2.DataOpenRequest(session_id="d-y", db="nowhere"), metadata=md()))
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details() != NOT_HELD
    err = rpc_error(lambda: query(stub, sid, question=""))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    for max_new in (5000, -1):
        err = rpc_error(lambda: stub.DataEvaluate(engine_pb2.DataEvaluateRequest(
            session_id=sid, questions=[QUESTION], max_new_tokens=max_new), metadata=md()))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_new_tokens" in err.details()


def test_open_past_the_replica_bound_is_resource_exhausted(replica):
    replica.core.data_sessions.max_sessions = 1
    open_session(replica.stub, "d-" + uuid.uuid4().hex)
    err = rpc_error(lambda: open_session(replica.stub, "d-" + uuid.uuid4().hex))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(err.trailing_metadata())[CODE_METADATA_KEY] == "RESOURCE_EXHAUSTED"


def test_another_tenant_sees_nothing(replica):
    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid)
    stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 2)), metadata=md(), timeout=DEADLINE_S)
    wait_version(stub, sid, 2)
    for tenant in ("bob", None):
        for call in (lambda: query(stub, sid, tenant=tenant),
                     lambda: stub.DataDescribe(engine_pb2.DataRef(session_id=sid), metadata=md(tenant)),
                     lambda: stub.DataEvaluate(engine_pb2.DataEvaluateRequest(session_id=sid, questions=[QUESTION]),
                                               metadata=md(tenant)),
                     lambda: stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(5, 1)),
                                           metadata=md(tenant))):
            err = rpc_error(call)
            assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, NOT_HELD)  # as if it did not exist
        closed = stub.DataClose(engine_pb2.DataRef(session_id=sid), metadata=md(tenant))
        assert closed.holds is False
    assert wait_version(stub, sid, 2).holds  # bob's close closed nothing; his push added nothing
    assert wait_version(stub, sid, 2).rows_in_cache == 2
    err = rpc_error(lambda: open_session(stub, sid, tenant="bob"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_rebuild_from_rows_gives_the_same_version_and_answer(replica):
    """Close, then DataOpen with the rows (as a gateway does after a replica loss):
    same data version, same rows retained, same answer (float64)."""
    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    settings = dict(retention="rebuild", retention_tokens=96, max_row_tokens=32)  # a few rows: the oldest leave
    open_session(stub, sid, **settings)
    rows = wire_rows(0, 12)
    for start in range(0, 12, 4):
        stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=rows[start:start + 4]), metadata=md(),
                      timeout=DEADLINE_S)
    live = wait_version(stub, sid, 12)
    assert live.rows_in_cache < 12  # retention took the oldest out
    before = query(stub, sid)
    stub.DataClose(engine_pb2.DataRef(session_id=sid), metadata=md(), timeout=DEADLINE_S)

    rebuilt = open_session(stub, sid, rows=rows, **settings)
    assert (rebuilt.version, rebuilt.rows_in_cache) == (12, live.rows_in_cache)
    after = query(stub, sid)
    assert (after.version, after.text, after.logit_gap) == (before.version, before.text, before.logit_gap)


def test_evaluate_answers_on_one_version(replica):
    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid)
    stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 3)), metadata=md(), timeout=DEADLINE_S)
    wait_version(stub, sid, 3)
    questions = [QUESTION, "How many readings are there?"]
    reply = stub.DataEvaluate(engine_pb2.DataEvaluateRequest(session_id=sid, questions=questions, max_new_tokens=12),
                              metadata=md(), timeout=DEADLINE_S)
    assert reply.version == 3 and [a.question for a in reply.answers] == questions
    assert {a.version for a in reply.answers} == {3}
    # exact: the flash answer is the query's
    assert reply.answers[0].text == query(stub, sid).text
    empty = stub.DataEvaluate(engine_pb2.DataEvaluateRequest(session_id=sid), metadata=md(), timeout=DEADLINE_S)
    assert (empty.version, len(empty.answers)) == (3, 0)


def test_version_events_reach_redis(tiny_runtime, db_root, redis_url):
    from headstart.data.live_store import LiveStore

    prefix = "t" + uuid.uuid4().hex[:8]
    publisher = VersionPublisher.from_url(redis_url, prefix=prefix)
    rep = Replica(tiny_runtime, db_root, publisher)
    try:
        sid = "d-" + uuid.uuid4().hex
        open_session(rep.stub, sid)
        for start in (0, 3):
            rep.stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(start, 3)), metadata=md(),
                              timeout=DEADLINE_S)
        wait_version(rep.stub, sid, 6)
        assert publisher.flush(DEADLINE_S)
        store = LiveStore(redis_url, prefix=prefix)
        assert store.current_version(sid) == 6
        events = store.events_after(sid, None)
        updates = [payload for _, kind, payload in events if kind == "data_updated"]
        assert updates and int(updates[-1]["version"]) == 6
        # every batch's event, in order: the rows added sum to the rows pushed
        assert sum(int(p["rows_added"]) for p in updates) == 6
        assert [int(p["version"]) for p in updates] == sorted(int(p["version"]) for p in updates)
        assert (publisher.dropped, publisher.failures) == (0, 0)
    finally:
        rep.stop()


def test_publisher_keeps_events_while_redis_is_down(redis_restartable):
    """A publish that fails is retried, in order, once Redis is back: nothing is lost."""
    from headstart.data.live_store import LiveStore
    from headstart.data.types import VersionEvent

    prefix = "t" + uuid.uuid4().hex[:8]
    publisher = VersionPublisher.from_url(redis_restartable.url, prefix=prefix)
    try:
        on_version = publisher.listener("s1", "alice")
        on_version(VersionEvent(version=1, rows_added=1, dropped_total=0, rows_in_cache=1))
        assert publisher.flush(DEADLINE_S)
        redis_restartable.stop()
        for version in (2, 3):
            on_version(VersionEvent(version=version, rows_added=1, dropped_total=0, rows_in_cache=version))
        assert not publisher.flush(0.3)  # cannot reach Redis: the events wait
        redis_restartable.start()
        assert publisher.flush(DEADLINE_S)
        store = LiveStore(redis_restartable.url, prefix=prefix)
        assert store.current_version("s1") == 3
        assert publisher.failures > 0 and publisher.dropped == 0
    finally:
        publisher.close()


def test_ready_exit_gap_reaches_the_session(replica):
    """DataSettingsWire.ready_exit_gap turns the speculative exit on: a one-token answer marked speculative."""
    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid, ready_exit_gap=0.0)
    stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 2)), metadata=md(), timeout=DEADLINE_S)
    wait_version(stub, sid, 2)
    session = replica.core.data_sessions.get(sid, "alice")
    session.wait_idle()  # the ready position is computed by a job after the batch
    ready = session.ready_position()
    assert ready is not None and ready.version == 2
    assert not query(stub, sid).speculative  # the random model's ready token is no fast answer
    # the wire carries the gap; the fast-answer vocabulary stays the engine's (here: that token)
    session.settings = replace(session.settings, ready_exit_vocabulary={ready.text.strip() or "x"})
    answer = query(stub, sid)
    assert (answer.speculative, answer.version, answer.text, answer.sql) == (True, 2, ready.text, "")
    assert answer.logit_gap == pytest.approx(ready.gap)
    assert json.loads(stub.DataDescribe(engine_pb2.DataRef(session_id=sid), metadata=md()).describe_json)[
        "ready_exits"] == 1


def test_flash_worker_answers_through_the_replica(tiny_runtime, db_root, redis_url):
    """Version events from the replica reach the flash worker (services/flash), which asks the
    replica's DataEvaluate over gRPC: the stored answer is the query's, on the newest version."""
    from headstart.data.live_store import LiveStore
    from services.flash.evaluator import GrpcEvaluator
    from services.flash.worker import FlashWorker, WorkerConfig
    from tests.flash_fakes import drain

    prefix = "t" + uuid.uuid4().hex[:8]
    rep = Replica(tiny_runtime, db_root, VersionPublisher.from_url(redis_url, prefix=prefix))
    store = LiveStore(redis_url, prefix=prefix)
    evaluator = GrpcEvaluator(f"127.0.0.1:{rep.port}", "headstart-engine", SECRET)
    try:
        sid = "alice:" + uuid.uuid4().hex
        open_session(rep.stub, sid)
        qid = store.register_flash(sid, QUESTION)
        rep.stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 3)), metadata=md(),
                          timeout=DEADLINE_S)
        wait_version(rep.stub, sid, 3)
        assert rep.data.publisher.flush(DEADLINE_S)
        worker = FlashWorker(store, evaluator, "w1", WorkerConfig(max_new_tokens=12, block_ms=10))
        drain(worker)
        stored = store.answer(sid, qid)
        expected = query(rep.stub, sid)
        assert (stored["version"], stored["text"]) == (3, expected.text)
        assert stored["logit_gap"] == pytest.approx(expected.logit_gap)
        assert worker.counts["stored"] == 1 and worker.counts["retries"] == 0
    finally:
        evaluator.close()
        store.close()
        rep.stop()


def test_a_waiting_query_does_not_hold_the_event_loop(replica, tiny_runtime):
    """A query waiting on a busy forward worker runs on a thread: other calls are answered meanwhile."""
    from tests.worker_gates import hold_worker

    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid)
    gate = hold_worker(tiny_runtime.worker)
    try:
        pending = [stub.DataQuery.future(engine_pb2.DataQueryRequest(session_id=sid, question=QUESTION,
                                                                     max_new_tokens=4), metadata=md())
                   for _ in range(3)]
        info = stub.DataDescribe(engine_pb2.DataRef(session_id=sid), metadata=md(), timeout=DEADLINE_S)
        ack = stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 1)), metadata=md(),
                            timeout=DEADLINE_S)
        assert info.holds and list(ack.seqs) == [1]
        assert not any(f.done() for f in pending)  # still behind the held worker
    finally:
        gate.set()
    assert {f.result(DEADLINE_S).question for f in pending} == {QUESTION}


def unevictable_charge(runtime, timeout: float = DEADLINE_S) -> int:
    """The KV bytes charged, less the idle typing sessions' (admission may evict those), read once
    the worker is idle and two readings 0.2 s apart agree."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        idle = runtime.worker.num_queued == 0 and runtime.worker.num_running == 0
        table = runtime.sessions
        with table._lock:  # the usage once every idle session is gone: each is charged at least its
            # reserve, and blocks only idle sessions borrow go with them
            busy = [s.kv_state for s in table._sessions.values() if not s.is_idle()]
            charged = table.memory.usage(busy, table._stored(), table._holders.values()).charged_bytes
        if idle and charged == last:
            return charged
        last = charged if idle else None
        time.sleep(0.2)
    raise AssertionError(f"the replica never went quiet in {timeout} s")


def test_past_the_kv_budget_is_resource_exhausted(replica, tiny_runtime):
    """Data sessions are charged to the replica's KV budget (headstart.data.budget): an open or a
    push past it is RESOURCE_EXHAUSTED and changes nothing; the session stays usable."""
    stub, sid = replica.stub, "d-" + uuid.uuid4().hex
    open_session(stub, sid, retention="shift", retention_tokens=2000)
    memory = tiny_runtime.kv_memory
    try:
        # what stays charged once every idle typing session is evicted (the runtime is shared: other
        # tests' idle sessions, evicted to make room, left this push room in a full run)
        memory.budget_bytes = unevictable_charge(tiny_runtime) + 20 * memory.bytes_per_token
        err = rpc_error(lambda: open_session(stub, "d-" + uuid.uuid4().hex))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "KV budget" in err.details()
        # 200 rows: far past the 20 tokens of room (a 6-row push went in during one full run; cause unproven)
        err = rpc_error(lambda: stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 200)),
                                              metadata=md()))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert replica.core.info().num_data_sessions == 1
    finally:
        memory.budget_bytes = 0
    ack = stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=wire_rows(0, 2)), metadata=md())
    assert list(ack.seqs) == [1, 2] and wait_version(stub, sid, 2).rows_in_cache == 2


def test_publisher_drops_an_event_redis_refuses_and_goes_on():
    """An event Redis refuses (not UNAVAILABLE) is retried, then dropped and counted; the next ones publish."""
    from headstart.data.live_store import LiveStoreError
    from services.engine.data_events import MAX_REFUSALS, PendingVersion

    class Store:  # logic only: which events reach publish_version, in which order
        def __init__(self):
            self.calls, self.published = [], []

        def publish_version(self, sid, tenant, version, rows_added, dropped_total):
            self.calls.append(version)
            if version == 2:
                raise LiveStoreError("WRONGTYPE")
            self.published.append(version)

    store = Store()
    publisher = VersionPublisher(store)
    try:
        for version in (1, 2, 3):
            publisher.submit(PendingVersion("s", "alice", version, 1, 0))
        assert publisher.flush(DEADLINE_S)
        assert store.published == [1, 3] and store.calls.count(2) == MAX_REFUSALS
        assert (publisher.published, publisher.dropped, publisher.failures) == (2, 1, MAX_REFUSALS)
    finally:
        publisher.close()
