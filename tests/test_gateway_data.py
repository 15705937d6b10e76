"""Integration: the gateway's data API on the real stack (real Redis, real Ray
Serve with 2 random:tiny float64 replicas, real HTTP / SSE / WebSocket / gRPC).

Answers are checked token-exact against a cold prefill of (frozen + rows +
question) in float64; drops against the acks, describe() and /metrics;
SSE resume against the whole event stream; tenants against each other.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time

import grpc
import httpx
import pytest
import torch
from websockets.sync.client import connect

from headstart.client import ApiError, HeadstartClient, answer_rows
from headstart.data.live_store import LiveStore
from headstart.data.prompt import DataPrompt
from headstart.data.rows import validate_row
from headstart.schema.resolve import resolve_database
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.guard import TENANT_METADATA_KEY
from services.gateway.sessions import engine_session_id
from tests.serve_helpers import recv_until, ws_connect

pytestmark = pytest.mark.slow

DB = "world_1"
ALICE, BOB = {"authorization": "Bearer tok-alice"}, {"authorization": "Bearer tok-bob"}
QUESTION = "How many cities are there?"
MAX_NEW = 10
_ids = itertools.count(20_000)  # city IDs no test reuses (world_1 has 1..4079: a clash is a refused row)


def cities(n: int) -> list[dict]:
    out = []
    for _ in range(n):
        i = next(_ids)
        out.append({"table": "city", "values": {"ID": i, "Name": f"Town {i}", "CountryCode": "NLD",
                                                "District": "Zuid", "Population": 1000 + i}})
    return out


@pytest.fixture(scope="module")
def http(serve_stack):
    with httpx.Client(base_url=serve_stack.http_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def store(serve_engine):
    s = LiveStore(serve_engine.redis_url)
    yield s
    s.close()


@pytest.fixture(scope="module")
def prompt(tiny_runtime):
    return DataPrompt(tiny_runtime.loaded.tokenizer, resolve_database(DB).schema)


def ok(response: httpx.Response) -> dict | list:
    assert response.status_code == 200, response.text
    return response.json()


def open_data(http, headers=ALICE, **options) -> str:
    body = {"db": DB, "retention": "rebuild", "retention_tokens": 4096, **options}
    return ok(http.post("/v1/data", json=body, headers=headers))["session_id"]


def wait_ingested(http, sid: str, version: int, headers=ALICE, timeout_s: float = 120) -> dict:
    """describe() once the replica has ingested every row up to `version` (nothing buffered)."""
    end = time.monotonic() + timeout_s
    while True:
        d = ok(http.get(f"/v1/data/{sid}", headers=headers))
        if d["data_version"] >= version and d["buffered"] == 0:
            return d
        assert time.monotonic() < end, d
        time.sleep(0.05)  # polling a remote replica's state


def cold_text(runtime, prompt: DataPrompt, rows: list[dict], question: str, max_new: int = MAX_NEW) -> str:
    """The greedy answer of a cold prefill of frozen + the rows' lines + the question."""
    ids = list(prompt.frozen_ids)
    for row in rows:
        ids += prompt.row_ids(validate_row(prompt.schema, row["table"], row["values"], 512).line)
    kv = runtime.runner.prefill(ids + prompt.question_ids(question))
    tokens = []
    for _ in range(max_new):
        token = int(torch.argmax(kv.last_logits))
        if token in runtime.stop_ids:
            break
        tokens.append(token)
        runtime.runner.extend(kv, [token])
    return prompt.decode(tokens)


def metric(http, name: str) -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_rest_rows_then_query_is_exact_against_a_cold_prefill(http, tiny_runtime, prompt):
    sid = open_data(http)
    pushed = []
    for _ in range(3):
        rows = cities(3)
        ack = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": rows}, headers=ALICE))
        assert len(ack["seqs"]) == 3 and ack["dropped"] == 0
        pushed += rows
    assert ack["seqs"][-1] == 9  # the gateway numbers a session's rows 1, 2, ...
    d = wait_ingested(http, sid, 9)
    assert d["rows_in_cache"] == 9 and d["dropped_total"] == 0 and d["db"] == DB
    answer = ok(http.post(f"/v1/data/{sid}/query", json={"question": QUESTION, "max_new_tokens": MAX_NEW},
                          headers=ALICE))
    assert answer["source"] == "model" and answer["version"] == 9
    assert answer["text"] == cold_text(tiny_runtime, prompt, pushed, QUESTION)
    assert isinstance(answer["rows"], list) and (answer["error"] or answer["columns"] is not None)
    ok(http.delete(f"/v1/data/{sid}", headers=ALICE))
    assert http.get(f"/v1/data/{sid}", headers=ALICE).status_code == 404


def test_malformed_rows_are_rejected_naming_the_row_and_the_session_goes_on(http, serve_stack, tiny_runtime, prompt):
    sid = open_data(http)
    good = cities(2)
    ok(http.post(f"/v1/data/{sid}/rows", json={"rows": good[:1]}, headers=ALICE))
    bad_rows = [
        ({"table": "city", "values": {"ID": 1, "Nme": "x"}}, "Nme"),  # unknown column
        ({"table": "town", "values": {"ID": 1}}, "town"),  # unknown table
        ({"table": "city", "values": {**good[1]["values"], "Population": "many"}}, "Population"),  # wrong type
        ({"table": "city", "values": {**good[1]["values"], "Name": "x" * 600}}, "characters"),  # oversized
    ]
    for bad, named in bad_rows:
        r = http.post(f"/v1/data/{sid}/rows", json={"rows": [good[1], bad]}, headers=ALICE)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "INVALID_ARGUMENT" and "row 1" in r.json()["message"] and named in r.json()["message"]
    with ws_connect(serve_stack) as ws:  # the WebSocket edge: an error message, the connection stays
        recv_until(ws, {"ready"})
        ws.send(json.dumps({"type": "data_push", "session_id": sid, "rows": [bad_rows[0][0]]}))
        error, _ = recv_until(ws, {"error", "data_ack"})
        assert error["type"] == "error" and error["code"] == "INVALID_ARGUMENT" and "Nme" in error["message"]
        ws.send(json.dumps({"type": "data_push", "session_id": sid, "rows": good[1:]}))
        ack, _ = recv_until(ws, {"error", "data_ack"})
    assert ack["type"] == "data_ack" and ack["seqs"] == [2]  # nothing rejected took a seq or a place
    with connect(f"{serve_stack.ws_url}/v1/sessions/ws?data=1&token=tok-alice", open_timeout=30) as producer:
        assert json.loads(producer.recv(timeout=30)) == {"type": "ready", "data": True}  # no typing session
        producer.send(json.dumps({"type": "input", "seq": 1, "text": "x"}))
        assert json.loads(producer.recv(timeout=30))["code"] == "INVALID_ARGUMENT"
        producer.send(json.dumps({"type": "data_push", "session_id": sid, "rows": [bad_rows[1][0]]}))
        error = json.loads(producer.recv(timeout=30))
        assert error["code"] == "INVALID_ARGUMENT" and "town" in error["message"]
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        with pytest.raises(ApiError) as err:
            client.push_rows(sid, [bad_rows[2][0]])
        assert err.value.code == "INVALID_ARGUMENT" and "Population" in err.value.message
    d = wait_ingested(http, sid, 2)
    assert d["rows_in_cache"] == 2 and d["dropped_total"] == 0
    answer = ok(http.post(f"/v1/data/{sid}/query", json={"question": QUESTION, "max_new_tokens": MAX_NEW},
                          headers=ALICE))
    assert answer["version"] == 2 and answer["text"] == cold_text(tiny_runtime, prompt, good, QUESTION)


def test_a_burst_past_the_buffer_drops_the_oldest_counted_exactly(http, serve_stack):
    sid = open_data(http, buffer_rows=2)
    before = metric(http, "headstart_gateway_data_rows_dropped_total")
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        acks = [client.push_rows(sid, cities(8), batch_rows=8) for _ in range(6)]
    seqs = [s for a in acks for s in a.seqs]
    dropped_seqs = [s for a in acks for s in a.dropped_seqs]
    assert seqs == list(range(1, 49))
    dropped = sum(a.dropped for a in acks)
    assert dropped == len(dropped_seqs) == len(set(dropped_seqs)) >= 6 * 6  # a buffer of 2 keeps 2 of 8
    assert acks[-1].dropped_total == dropped
    d = wait_ingested(http, sid, 48)
    assert d["dropped_total"] == dropped and d["rows_in_cache"] + dropped == 48
    assert metric(http, "headstart_gateway_data_rows_dropped_total") - before == dropped
    def announced(events):
        return [s for _, kind, p in events if kind == "rows_dropped" for s in p["dropped_seqs"]]

    events = sse(http, sid, ALICE, lambda ev: len(announced(ev)) >= len(dropped_seqs), query="?last_event_id=0-0")
    assert announced(events) == dropped_seqs  # every drop announced once, in order
    kept = ok(http.post(f"/v1/data/{sid}/query", json={"question": "SELECT", "max_new_tokens": 1},
                        headers=ALICE))
    assert kept["version"] == 48  # the newest row is never the one dropped


def sse(http, sid: str, headers: dict, stop, last_id: str | None = None, query: str = "",
        timeout_s: float = 120.0, after_open=lambda: None) -> list[tuple]:
    """(id, kind, payload) events of a subscription until `stop(events)` is true (within `timeout_s`:
    the server sends a keep-alive comment every ~15 s, so a quiet stream still gets here).
    `after_open()` runs once the response started: the subscription's "now" is fixed by then."""
    headers = {**headers, **({"Last-Event-ID": last_id} if last_id else {})}
    events, fields = [], {}
    deadline = time.monotonic() + timeout_s
    with http.stream("GET", f"/v1/data/{sid}/events{query}", headers=headers) as response:
        assert response.status_code == 200
        after_open()
        for line in response.iter_lines():
            assert time.monotonic() < deadline, f"no stop condition in {timeout_s} s: {events}"
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if fields:
                events.append((fields["id"], fields["event"], json.loads(fields["data"])))
                fields = {}
                if stop(events):
                    return events
    raise AssertionError(f"the stream ended after {events}")


def at_version(version: int):
    return lambda events: any(k == "data_updated" and p["version"] >= version for _, k, p in events)


def test_sse_resumes_after_last_event_id_without_gap_or_duplicate(http):
    sid = open_data(http)

    def push_three():
        for _ in range(3):
            ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(2)}, headers=ALICE))

    first = sse(http, sid, ALICE, at_version(6), after_open=push_three)  # "now": every event is after it
    assert first and first[-1][1] == "data_updated" and first[-1][2]["version"] == 6
    cut = first[len(first) // 2]
    for _ in range(2):  # while nobody listens
        ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(2)}, headers=ALICE))
    resumed = sse(http, sid, ALICE, at_version(10), last_id=cut[0])
    everything = sse(http, sid, ALICE, at_version(10), query="?last_event_id=0-0")
    ids = [e[0] for e in everything]
    assert len(ids) == len(set(ids))
    assert [e[0] for e in resumed] == ids[ids.index(cut[0]) + 1:]  # no gap, no duplicate
    assert [e[0] for e in first] == ids[:len(first)]
    versions = [p["version"] for _, k, p in everything if k == "data_updated"]
    assert versions == sorted(versions) and versions[-1] == 10
    r = http.get(f"/v1/data/{sid}/events", headers={**ALICE, "Last-Event-ID": "not an id"})
    assert r.status_code == 400


def test_another_tenants_session_id_is_not_found_everywhere(http, serve_stack):
    sid = open_data(http)
    ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(1)}, headers=ALICE))
    qid = ok(http.post(f"/v1/data/{sid}/flash", json={"question": QUESTION}, headers=ALICE))["id"]
    calls = [("GET", f"/v1/data/{sid}", None), ("POST", f"/v1/data/{sid}/rows", {"rows": cities(1)}),
             ("POST", f"/v1/data/{sid}/query", {"question": QUESTION}), ("GET", f"/v1/data/{sid}/flash", None),
             ("POST", f"/v1/data/{sid}/flash", {"question": "x"}), ("DELETE", f"/v1/data/{sid}/flash/{qid}", None),
             ("GET", f"/v1/data/{sid}/events", None), ("DELETE", f"/v1/data/{sid}", None)]
    for method, path, body in calls:
        r = http.request(method, path, json=body, headers=BOB)
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", (method, path, r.text)
    with HeadstartClient(serve_stack.grpc_target, token="tok-bob") as bob:
        for call in (lambda: bob.describe_data(sid), lambda: bob.push_rows(sid, cities(1)),
                     lambda: bob.query_data(sid, QUESTION), lambda: next(bob.subscribe(sid))):
            with pytest.raises(ApiError) as err:
                call()
            assert err.value.code == "NOT_FOUND"
    with ws_connect(serve_stack, token="tok-bob") as ws:
        recv_until(ws, {"ready"})
        ws.send(json.dumps({"type": "data_push", "session_id": sid, "rows": cities(1)}))
        error, _ = recv_until(ws, {"error", "data_ack"})
        assert error["code"] == "NOT_FOUND"
    d = wait_ingested(http, sid, 1)  # alice's session is untouched
    assert d["rows_in_cache"] == 1
    assert [q["id"] for q in ok(http.get(f"/v1/data/{sid}/flash", headers=ALICE))] == [qid]


def test_grpc_push_stream_query_subscribe_and_close(serve_stack, tiny_runtime, prompt):
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        sid = client.open_data(DB, retention="rebuild", retention_tokens=4096).session_id
        events = client.subscribe(sid)
        rows = cities(5)
        ack = client.push_rows(sid, rows, batch_rows=2)  # three messages on one stream, one ack
        assert list(ack.seqs) == [1, 2, 3, 4, 5] and ack.dropped == 0
        seen = []
        for event in events:
            seen.append(event)
            if event.kind == "data_updated" and json.loads(event.payload_json)["version"] == 5:
                break
        events.close()
        assert all(e.id for e in seen)
        d = client.describe_data(sid)
        assert d.data_version == 5 and d.rows_in_cache == 5 and d.db == DB
        answer = client.query_data(sid, QUESTION, MAX_NEW)
        assert answer.source == "model" and answer.version == 5
        assert answer.text == cold_text(tiny_runtime, prompt, rows, QUESTION)
        assert isinstance(answer_rows(answer), list)
        client.close_data(sid)
        with pytest.raises(ApiError) as err:
            client.describe_data(sid)
        assert err.value.code == "NOT_FOUND"


def test_a_replica_that_lost_the_session_rebuilds_it_from_the_rows_log(http, serve_engine, tiny_runtime, prompt):
    sid = open_data(http)
    rows = cities(4)
    ok(http.post(f"/v1/data/{sid}/rows", json={"rows": rows}, headers=ALICE))
    wait_ingested(http, sid, 4)
    before = ok(http.post(f"/v1/data/{sid}/query", json={"question": QUESTION, "max_new_tokens": MAX_NEW},
                          headers=ALICE))
    eid = engine_session_id("alice", sid)
    rebuilds = metric(http, "headstart_gateway_data_rebuilds_total")
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:  # the replica forgets it (as if it died)
        info = engine_pb2_grpc.EngineStub(channel).DataClose(
            engine_pb2.DataRef(session_id=eid), metadata=(*serve_engine.metadata(eid), (TENANT_METADATA_KEY, "alice")))
    assert info.rows_in_cache == 4  # it held the session (DataClose answers its last describe)
    more = cities(2)
    ack = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": more}, headers=ALICE))
    assert ack["seqs"] == [5, 6]
    assert metric(http, "headstart_gateway_data_rebuilds_total") == rebuilds + 1
    wait_ingested(http, sid, 6)
    after = ok(http.post(f"/v1/data/{sid}/query", json={"question": QUESTION, "max_new_tokens": MAX_NEW},
                         headers=ALICE))
    assert before["text"] == cold_text(tiny_runtime, prompt, rows, QUESTION)
    assert after["version"] == 6 and after["text"] == cold_text(tiny_runtime, prompt, rows + more, QUESTION)


@pytest.fixture
def flash_worker(serve_engine):
    """The flash worker (services/flash) in this process, on the stack's Redis and engine."""
    from services.flash.evaluator import GrpcEvaluator
    from services.flash.worker import FlashWorker, WorkerConfig

    store = LiveStore(serve_engine.redis_url)
    evaluator = GrpcEvaluator(serve_engine.grpc_target, serve_engine.app_name, serve_engine.secret)
    worker = FlashWorker(store, evaluator, f"test-{time.monotonic_ns()}",
                         WorkerConfig(max_new_tokens=MAX_NEW, block_ms=200, retry_idle_ms=500))
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    yield worker
    stop.set()
    thread.join(30)
    evaluator.close()
    store.close()


def test_flash_answers_come_from_redis_at_the_current_version_and_never_stale(http, flash_worker, tiny_runtime,
                                                                              prompt):
    sid = open_data(http)
    question = "How many cities are in Zuid?"
    qid = ok(http.post(f"/v1/data/{sid}/flash", json={"question": f"  {question} "}, headers=ALICE))["id"]
    assert ok(http.get(f"/v1/data/{sid}/flash", headers=ALICE)) == [{"id": qid, "question": question}]
    hits = metric(http, 'headstart_gateway_data_queries_total{source="flash"}')
    rows = cities(3)
    ok(http.post(f"/v1/data/{sid}/rows", json={"rows": rows}, headers=ALICE))
    ready = [e for e in sse(http, sid, ALICE, lambda ev: any(k == "flash_ready" and p["version"] == 3
                                                              for _, k, p in ev), query="?last_event_id=0-0")
             if e[1] == "flash_ready"]
    assert ready[-1][2]["version"] == 3 and ready[-1][2]["id"] == qid
    answer = ok(http.post(f"/v1/data/{sid}/query", json={"question": question, "max_new_tokens": MAX_NEW},
                          headers=ALICE))
    assert answer["source"] == "flash" and answer["version"] == 3  # the stored answer, no model call
    assert answer["text"] == cold_text(tiny_runtime, prompt, rows, question)
    assert metric(http, 'headstart_gateway_data_queries_total{source="flash"}') == hits + 1
    listed = ok(http.get(f"/v1/data/{sid}/flash", headers=ALICE))
    assert listed[0]["answer"]["version"] == 3 and listed[0]["answer"]["sql"] == answer["sql"]

    more = cities(2)
    ok(http.post(f"/v1/data/{sid}/rows", json={"rows": more}, headers=ALICE))
    sse(http, sid, ALICE, at_version(5), query="?last_event_id=0-0")  # version 5 is published (current)
    while True:  # until the worker has answered version 5: never the version-3 answer meanwhile
        now = ok(http.post(f"/v1/data/{sid}/query", json={"question": question, "max_new_tokens": MAX_NEW},
                           headers=ALICE))
        assert now["version"] == 5, now
        assert now["text"] == cold_text(tiny_runtime, prompt, rows + more, question)
        if now["source"] == "flash":
            break
    assert ok(http.get(f"/v1/data/{sid}/flash", headers=ALICE))[0]["answer"]["version"] == 5
    ok(http.delete(f"/v1/data/{sid}/flash/{qid}", headers=ALICE))
    assert ok(http.get(f"/v1/data/{sid}/flash", headers=ALICE)) == []
    gone = ok(http.post(f"/v1/data/{sid}/query", json={"question": question, "max_new_tokens": MAX_NEW},
                        headers=ALICE))
    assert gone["source"] == "model"
    assert http.delete(f"/v1/data/{sid}/flash/{qid}", headers=ALICE).status_code == 404


def test_async_client_data_methods(serve_stack, tiny_runtime, prompt):
    import asyncio

    from headstart.client import AsyncHeadstartClient

    rows = cities(2)

    async def run():
        async with AsyncHeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
            sid = (await client.open_data(DB, retention="rebuild", retention_tokens=4096)).session_id
            events = await client.subscribe(sid)
            ack = await client.push_rows(sid, rows)
            async for event in events:
                if event.kind == "data_updated" and json.loads(event.payload_json)["version"] == 2:
                    break
            events.close()
            qid = (await client.register_flash(sid, QUESTION)).id
            listed = await client.list_flash(sid)
            answer = await client.query_data(sid, QUESTION, MAX_NEW)
            await client.delete_flash(sid, qid)
            after = await client.list_flash(sid)
            await client.close_data(sid)
            return ack, listed, answer, after, qid

    ack, listed, answer, after, qid = asyncio.run(run())
    assert list(ack.seqs) == [1, 2]
    assert [(q.id, q.question) for q in listed] == [(qid, QUESTION)] and after == []
    assert answer.version == 2 and answer.text == cold_text(tiny_runtime, prompt, rows, QUESTION)


def test_a_push_that_fails_at_the_engine_leaves_nothing_in_the_rows_log(http, make_gateway, store):
    sid = open_data(http)
    ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(2)}, headers=ALICE))
    cut_off = make_gateway(engine_target="127.0.0.1:1")  # same Redis, no engine behind it
    with httpx.Client(base_url=cut_off.http_url, timeout=60) as other:
        assert ok(other.get(f"/v1/data/{sid}/flash", headers=ALICE)) == []  # the session is known there too
        r = other.post(f"/v1/data/{sid}/rows", json={"rows": cities(3)}, headers=ALICE)
    assert r.status_code == 503 and r.json()["code"] == "UNAVAILABLE"
    eid = engine_session_id("alice", sid)
    assert [seq for seq, _ in store.rows(eid)] == [1, 2]
    ack = ok(http.post(f"/v1/data/{sid}/rows", json={"rows": cities(1)}, headers=ALICE))
    assert ack["seqs"] == [6]  # numbers are never reused; the replica sees them increasing
    assert wait_ingested(http, sid, 6)["rows_in_cache"] == 3


def test_row_characters_are_budgeted_per_tenant(make_gateway):
    stack = make_gateway(data_chars_per_s=1, data_chars_burst=200)
    with httpx.Client(base_url=stack.http_url, timeout=60) as gw:
        sid = open_data(gw)
        ok(gw.post(f"/v1/data/{sid}/rows", json={"rows": cities(1)}, headers=ALICE))  # ~90 characters
        r = gw.post(f"/v1/data/{sid}/rows", json={"rows": cities(2)}, headers=ALICE)
        assert r.status_code == 429 and r.json()["code"] == "RATE_LIMITED"
        bob = open_data(gw, headers=BOB)  # another tenant's budget is its own
        ok(gw.post(f"/v1/data/{bob}/rows", json={"rows": cities(1)}, headers=BOB))
        assert wait_ingested(gw, sid, 1)["rows_in_cache"] == 1  # the refused push took nothing


def test_a_tenant_holds_at_most_its_share_of_data_sessions(make_gateway):
    stack = make_gateway(tokens={"tok-carol": "carol", "tok-dave": "dave"}, data_sessions_per_tenant=2)
    carol, dave = {"authorization": "Bearer tok-carol"}, {"authorization": "Bearer tok-dave"}
    with httpx.Client(base_url=stack.http_url, timeout=60) as gw:
        first, _ = open_data(gw, carol), open_data(gw, carol)
        r = gw.post("/v1/data", json={"db": DB}, headers=carol)
        assert r.status_code == 429 and r.json()["code"] == "RESOURCE_EXHAUSTED"
        open_data(gw, dave)  # another tenant's share is its own
        ok(gw.delete(f"/v1/data/{first}", headers=carol))
        open_data(gw, carol)
