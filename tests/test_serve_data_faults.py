"""Integration (issue 29, item 2): a data session never stops silently, on the real stack.

- A row with an integer outside SQLite's 64-bit range is refused at the edge
  with the row named (it used to be acked, then freeze ingestion for good).
- An ingestion batch that fails on the replica (its working copy corrupted
  under it, as a failing disk would) moves the session to `failed`:
  describe says so with the reason, a `session_failed` event is published,
  and every push and query is a typed SESSION_FAILED (409); close still works.
  It used to say `live` while acked rows piled up unseen.
- A replica that rebuilds a session from a rows log holding a row it cannot
  take (logged before the edge refused such rows) refuses that row by seq
  and goes on; every call used to answer 500 after such a rebuild.
"""

from __future__ import annotations

import glob
import os
import tempfile
import time

import grpc
import pytest

from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.guard import TENANT_METADATA_KEY
from services.gateway.sessions import engine_session_id
from tests.test_gateway_data import ALICE, QUESTION, cities, http, ok, open_data, store, wait_ingested  # noqa: F401

pytestmark = pytest.mark.slow


def _wait_state(http, sid: str, state: str, timeout_s: float = 60.0) -> dict:  # noqa: F811
    end = time.monotonic() + timeout_s
    while True:
        d = ok(http.get(f"/v1/data/{sid}", headers=ALICE))
        if d["state"] == state:
            return d
        assert time.monotonic() < end, d
        time.sleep(0.05)  # polling a remote replica's state


def test_an_integer_beyond_64_bits_is_refused_at_the_edge_naming_the_row(http):  # noqa: F811
    sid = open_data(http)
    try:
        good, bad = cities(2)
        bad["values"]["Population"] = 1 << 63  # the request that froze a session
        r = http.post(f"/v1/data/{sid}/rows", json={"rows": [good, bad]}, headers=ALICE)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "INVALID_ARGUMENT"
        assert r.json()["message"].startswith("row 1: city.Population: 9223372036854775808 is outside")
        bad["values"]["Population"] = (1 << 63) - 1  # the largest one SQLite holds goes in
        seqs = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": [good, bad]}, headers=ALICE))["seqs"]
        d = wait_ingested(http, sid, seqs[-1])
        assert (d["state"], d["rows_in_cache"], d["describe"]["refused"]) == ("live", 2, 0)
    finally:
        http.delete(f"/v1/data/{sid}", headers=ALICE)


def test_a_failed_ingestion_is_reported_everywhere(http, store):  # noqa: F811
    pattern = os.path.join(tempfile.gettempdir(), "headstart-data-*", "working.sqlite")
    before = set(glob.glob(pattern))
    sid = open_data(http)
    eid = engine_session_id("alice", sid)
    try:
        (copy,) = set(glob.glob(pattern)) - before  # this session's working copy, on its replica
        first = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(2)}, headers=ALICE))["seqs"]
        wait_ingested(http, sid, first[-1])
        with open(copy, "r+b") as f:  # the header's magic string: SQLite now says "file is not a database"
            f.write(b"\0" * 100)
        ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(2)}, headers=ALICE))
        d = _wait_state(http, sid, "failed")
        assert "not a database" in d["failure"] and d["data_version"] == first[-1], d
        for method, path, body in (("POST", "rows", {"rows": cities(1)}), ("POST", "query", {"question": QUESTION}),
                                   ("POST", "flash", {"question": QUESTION})):
            r = http.request(method, f"/v1/data/{sid}/{path}", json=body, headers=ALICE)
            assert (r.status_code, r.json()["code"]) == (409, "SESSION_FAILED"), (path, r.text)
            assert "not a database" in r.json()["message"]
        end = time.monotonic() + 30
        while not [e for e in store.events_after(eid, "0") if e.kind == "session_failed"]:
            assert time.monotonic() < end, "no session_failed event"
            time.sleep(0.05)  # the replica publishes it from its own thread
        (event,) = [e for e in store.events_after(eid, "0") if e.kind == "session_failed"]
        assert event.payload["code"] == "SESSION_FAILED" and "not a database" in event.payload["reason"]
    finally:
        assert http.delete(f"/v1/data/{sid}", headers=ALICE).status_code == 200
    assert http.get(f"/v1/data/{sid}", headers=ALICE).status_code == 404


def test_a_rebuild_refuses_a_logged_row_it_cannot_take(http, store, serve_engine):  # noqa: F811
    sid = open_data(http)
    eid = engine_session_id("alice", sid)
    try:
        ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(1)}, headers=ALICE))
        bad = cities(1)[0]
        bad["values"]["Population"] = 1 << 63
        (seq,) = store.log_push(eid, [bad]).seqs  # a row logged before the edge refused it (the old gateway)
        last = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(1)}, headers=ALICE))["seqs"][-1]
        # the replica loses the session: the next call rebuilds it from the log
        with grpc.insecure_channel(serve_engine.grpc_target) as channel:
            engine_pb2_grpc.EngineStub(channel).DataClose(
                engine_pb2.DataRef(session_id=eid), metadata=(*serve_engine.metadata(eid), (TENANT_METADATA_KEY, "alice")))
        d = wait_ingested(http, sid, last)
        assert (d["state"], d["data_version"], d["rows_in_cache"]) == ("live", last, 2), d
        assert d["describe"]["restored"] == 3 and d["describe"]["refused"] == 1
        ((refused_seq, reason),) = d["describe"]["last_refusals"]
        assert refused_seq == seq and "outside SQLite's integer range" in reason
        answer = ok(http.post(f"/v1/data/{sid}/query", json={"question": QUESTION, "max_new_tokens": 4},
                              headers=ALICE))
        assert answer["version"] == last
        more = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(1)}, headers=ALICE))["seqs"]
        assert wait_ingested(http, sid, more[-1])["rows_in_cache"] == 3
    finally:
        http.delete(f"/v1/data/{sid}", headers=ALICE)
