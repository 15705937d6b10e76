"""Integration: data sessions through a real Ray Serve (tests/serve_fixture.py's
engine, 2 replicas, random:tiny float64). Sticky routing keeps a data session
on one replica; when that replica is killed the session's calls land on
another, which answers NOT_FOUND "data session not on this replica" until it
is re-opened with the rows (as the gateway does), and then gives the same
version and the same answer.

The test calls the engine as the gateway does, meta first: a replica closes
every data session whose meta is not in Redis (services/engine/data_reconcile.py,
every 5 s), so without it the session vanished whenever a reconcile fell
between the open and the next call."""

from __future__ import annotations

import contextlib
import json
import time
import uuid

import grpc
import pytest

from headstart.data.live_store import LiveStore
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.data_registry import NOT_HELD
from services.engine.guard import TENANT_METADATA_KEY
from tests.test_serve_failover import _wait_replicas_running

pytestmark = pytest.mark.slow
QUESTION = "Which names are there?"
DEADLINE_S = 120.0


def _rows(n: int) -> list[engine_pb2.DataRowWire]:
    return [engine_pb2.DataRowWire(seq=i + 1, table="t", values_json=json.dumps({"id": 1000 + i, "name": f"n{i}"}))
            for i in range(n)]


def _describe_until(stub, sid: str, md, version: int) -> engine_pb2.DataInfo:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        info = stub.DataDescribe(engine_pb2.DataRef(session_id=sid), metadata=md, timeout=30)
        if info.version >= version and info.buffered == 0:
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"version {info.version}, waited for {version}")
        time.sleep(0.05)


def _reopen_elsewhere(stub, sid: str, md, rows, killed: str) -> tuple[engine_pb2.DataInfo, int]:
    """What the gateway does after a replica loss: call, and on NOT_FOUND re-open with the rows.
    Returns the re-opened session's info and how many calls failed UNAVAILABLE meanwhile."""
    deadline, unavailable = time.monotonic() + DEADLINE_S, 0
    while True:
        try:
            info = stub.DataDescribe(engine_pb2.DataRef(session_id=sid), metadata=md, timeout=30)
            raise AssertionError(f"a replica holds the session without a re-open: {info}")
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                assert exc.details() == NOT_HELD
                break
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                                  grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED) or time.monotonic() > deadline:
                raise
            unavailable += 1  # the router has not dropped the dead replica yet
            time.sleep(0.2)
    info = stub.DataOpen(engine_pb2.DataOpenRequest(session_id=sid, db="blobs", tenant="alice", rows=rows),
                         metadata=md, timeout=DEADLINE_S)
    assert info.replica != killed
    return info, unavailable


def test_data_session_sticky_then_rebuilt_from_rows_after_replica_killed(serve_engine):
    import ray

    _wait_replicas_running(serve_engine)  # a replica set that is still changing moves sessions
    sid = "alice:data-" + uuid.uuid4().hex
    md = serve_engine.metadata(sid) + ((TENANT_METADATA_KEY, "alice"),)
    rows = _rows(6)
    store = LiveStore(serve_engine.redis_url)  # the replicas' store (prefix "hs")
    store.put_meta(sid, {"db": "blobs", "tenant": "alice"})  # what the gateway writes before it opens one
    with contextlib.closing(store), grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        opened = stub.DataOpen(engine_pb2.DataOpenRequest(session_id=sid, db="blobs", tenant="alice"),
                               metadata=md, timeout=DEADLINE_S)
        for start in (0, 3):
            stub.DataPush(engine_pb2.DataPushRequest(session_id=sid, rows=rows[start:start + 3]), metadata=md,
                          timeout=30)
        live = _describe_until(stub, sid, md, 6)
        before = stub.DataQuery(engine_pb2.DataQueryRequest(session_id=sid, question=QUESTION, max_new_tokens=12),
                                metadata=md, timeout=DEADLINE_S)
        # sticky: every call of the session reached the replica that opened it
        seen = {opened.replica, live.replica} | {
            stub.DataDescribe(engine_pb2.DataRef(session_id=sid), metadata=md, timeout=30).replica for _ in range(6)}
        assert seen == {opened.replica}
        assert before.version == 6
        replica_info = stub.Describe(engine_pb2.EngineSessionRef(session_id=sid), metadata=md, timeout=30)
        assert replica_info.replica == opened.replica
        assert replica_info.num_data_sessions >= 1 and replica_info.kv_data_bytes > 0
        assert replica_info.num_sessions >= replica_info.num_data_sessions

        ray.kill(ray.get_actor(opened.replica, namespace="serve"), no_restart=True)
        killed = time.perf_counter()
        rebuilt, unavailable = _reopen_elsewhere(stub, sid, md, rows, opened.replica)
        reopened_ms = (time.perf_counter() - killed) * 1000
        assert (rebuilt.holds, rebuilt.version, rebuilt.rows_in_cache) == (True, 6, live.rows_in_cache)
        after = stub.DataQuery(engine_pb2.DataQueryRequest(session_id=sid, question=QUESTION, max_new_tokens=12),
                               metadata=md, timeout=DEADLINE_S)
        stub.DataClose(engine_pb2.DataRef(session_id=sid), metadata=md, timeout=30)
        store.client.delete(store.key(sid, "meta"))
    assert (after.version, after.text, after.logit_gap) == (before.version, before.text, before.logit_gap)
    print(f"\ndata session re-opened from {len(rows)} rows on another replica {reopened_ms:.0f} ms after the kill "
          f"({unavailable} calls UNAVAILABLE meanwhile)")
    _wait_replicas_running(serve_engine)
