"""Integration: what a hostile or careless tenant cannot do (issue 16), on the real
stack (Ray Serve engine, gateway, two tenants): reach a database outside the
catalogue, reach the engine without its secret, lock the other tenant out,
blow up a response, or hold the other's requests; and the contract gaps
(each a typed error on its edge)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import threading
import time

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from headstart.client import ApiError, HeadstartClient
from headstart.client.errors import CODE_METADATA_KEY
from headstart.schema.catalogue import unknown
from headstart.v1 import engine_pb2, engine_pb2_grpc, headstart_pb2, headstart_pb2_grpc
from tests.serve_fixture import MAX_ATTACHED, NUM_REPLICAS
from tests.serve_helpers import recv, recv_until, ws_connect

pytestmark = pytest.mark.slow

ALICE = {"authorization": "Bearer tok-alice"}
BOB = {"authorization": "Bearer tok-bob"}
SHARE = MAX_ATTACHED * NUM_REPLICAS // 2  # two tenants share the engine's capacity


def _hostile_dbs(serve_engine) -> list[str]:
    spider_file = "../shared/data/spider/database/world_1/world_1.sqlite"
    return [str(serve_engine.db_root / "blobs.sqlite"), spider_file, "/proc/self/status", "/etc/passwd",
            "/no/such/file.sqlite", "postgresql://u:a@127.0.0.1:1/db", "postgres://10.0.0.1:5432/x", "x" * 600]


def _assert_reveals_nothing(db: str, code: str, message: str) -> None:
    """The one message of an unregistered name: the same whether a file or host by that name exists."""
    assert (code, message) == ("NOT_FOUND", str(unknown(db)))
    assert "u:a@" not in message  # a DSN's password is not echoed


def _metric(stack, name: str, **labels) -> float:
    text = httpx.get(f"{stack.http_url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_client_paths_and_dsns_refused_on_every_edge(serve_stack, serve_engine):
    for db in _hostile_dbs(serve_engine):
        seen = []
        for path, body in (("/v1/sessions", {"db": db}), ("/v1/complete", {"db": db, "question": "How many"}),
                           ("/v1/execute", {"db": db, "sql": "SELECT 1"})):
            r = httpx.post(f"{serve_stack.http_url}{path}", json=body, headers=ALICE, timeout=30)
            seen.append((r.status_code, r.json()["code"], r.json()["message"]))
        with ws_connect(serve_stack, db=db) as ws:
            message = recv(ws)
            with pytest.raises(Exception):
                recv(ws, 5)
        seen.append((ws.close_code, message["code"], message["message"]))
        with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
            for call in (lambda: client.open_session(db), lambda: client.complete(db, "How many", 4)):
                with pytest.raises(ApiError) as err:
                    call()
                seen.append(("grpc", err.value.code, err.value.message))
        for status, code, message in seen:
            _assert_reveals_nothing(db, code, message)
        assert {s for s, _, _ in seen} == {404, 4404, "grpc"}


def test_catalogue_sqlite_root_is_served_by_name(serve_stack):
    r = httpx.post(f"{serve_stack.http_url}/v1/execute", json={"db": "blobs", "sql": "SELECT count(*) FROM t"},
                   headers=BOB, timeout=30)
    assert r.json()["rows"] == [[30]]
    with HeadstartClient(serve_stack.grpc_target, token="tok-bob") as client:
        sid = client.open_session("blobs")
        client.close_session(sid)
        assert "blobs" in {d.id for d in client.list_databases()}
    # Registered but unreadable: a typed error that names the database only.
    r = httpx.post(f"{serve_stack.http_url}/v1/sessions", json={"db": "not_a_db"}, headers=BOB, timeout=60)
    assert r.json()["code"] == "UNAVAILABLE" and "not_a_db" in r.json()["message"]
    assert "/" not in r.json()["message"] and "file is not" not in r.json()["message"]


def _engine_calls(stub, metadata):
    """The four engine RPCs without (or with a wrong) secret -> what each answered."""
    out = {}
    for name in ("Describe", "CloseSession"):
        try:
            getattr(stub, name)(engine_pb2.EngineSessionRef(session_id="victim"), metadata=metadata, timeout=30)
            out[name] = "OK"
        except grpc.RpcError as exc:
            out[name] = exc.code().name
    attach = engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="victim", db="world_1"))
    out["Session"] = [e.error.code for e in stub.Session(iter([attach]), metadata=metadata, timeout=30)]
    request = engine_pb2.EngineCompleteRequest(db="world_1", question="How many")
    out["Complete"] = [e.error.code for e in stub.Complete(request, metadata=metadata, timeout=30)]
    return out


def test_engine_port_refuses_calls_without_the_secret(serve_engine):
    refused = {"Describe": "UNAUTHENTICATED", "CloseSession": "UNAUTHENTICATED",
               "Session": ["UNAUTHENTICATED"], "Complete": ["UNAUTHENTICATED"]}
    app = (("application", serve_engine.app_name), ("session_id", "victim"))
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        assert _engine_calls(stub, app) == refused
        assert _engine_calls(stub, app + (("headstart-engine-secret", "guess"),)) == refused
        # With the secret, the engine edge still takes catalogue names only.
        attach = engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="x1", db="/etc/passwd"))
        events = list(stub.Session(iter([attach]), metadata=serve_engine.metadata("x1"), timeout=30))
    assert [(e.error.code, e.error.message.startswith("unknown database")) for e in events] == [("NOT_FOUND", True)]


def test_one_tenants_flood_leaves_the_other_its_share(serve_stack):
    alice_codes, bob_ids = [], []
    with contextlib.ExitStack() as alice_ws:
        for _ in range(SHARE + 2):  # a WebSocket flood: each opens a session
            first = recv(alice_ws.enter_context(ws_connect(serve_stack)))
            alice_codes.append(first.get("code", first["type"]))
        r = httpx.post(f"{serve_stack.http_url}/v1/sessions", json={"db": "world_1"}, headers=ALICE, timeout=30)
        try:
            for _ in range(SHARE):
                opened = httpx.post(f"{serve_stack.http_url}/v1/sessions", json={"db": "world_1"}, headers=BOB,
                                    timeout=60)
                bob_ids.append(opened.json().get("session_id", opened.json().get("code")))
        finally:
            for sid in bob_ids:
                httpx.delete(f"{serve_stack.http_url}/v1/sessions/{sid}", headers=BOB)
    assert alice_codes == ["ready"] * SHARE + ["RESOURCE_EXHAUSTED"] * 2
    assert r.json()["code"] == "RESOURCE_EXHAUSTED"
    assert len([s for s in bob_ids if len(s) == 32]) == SHARE, bob_ids


def test_rest_sessions_expire_when_idle(make_gateway):
    stack = make_gateway(session_idle_s=0.3)
    sid = httpx.post(f"{stack.http_url}/v1/sessions", json={"db": "world_1"}, headers=ALICE, timeout=60).json()
    for _ in range(100):
        if httpx.get(f"{stack.http_url}/healthz").json()["sessions"] == 0:
            break
        time.sleep(0.1)
    r = httpx.delete(f"{stack.http_url}/v1/sessions/{sid['session_id']}", headers=ALICE)
    assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND"


def test_work_budget_is_per_tenant_not_per_connection(make_gateway):
    stack = make_gateway(tenant_chars_per_s=10, tenant_chars_burst=2500)
    text = "How many singers " + "x" * 1500
    codes = {}
    with ws_connect(stack) as a1, ws_connect(stack) as a2, ws_connect(stack, token="tok-bob") as b1:
        for name, ws in (("alice-1", a1), ("alice-2", a2), ("bob", b1)):
            assert recv(ws)["type"] == "ready"
            ws.send(json.dumps({"type": "input", "seq": 1, "text": text}))
            message, _ = recv_until(ws, {"progress", "error"})
            while message["type"] == "progress" and message["seq"] != 1:
                message, _ = recv_until(ws, {"progress", "error"})
            codes[name] = message.get("code", message["type"])
    assert codes == {"alice-1": "progress", "alice-2": "RATE_LIMITED", "bob": "progress"}


def _run(stack, sql: str, headers=ALICE, db: str = "blobs") -> httpx.Response:
    return httpx.post(f"{stack.http_url}/v1/execute", json={"db": db, "sql": sql}, headers=headers, timeout=60)


def test_execute_bounds_bytes_as_well_as_rows(serve_stack):
    huge = _run(serve_stack, "SELECT zeroblob(9000000) FROM t LIMIT 20")
    assert huge.status_code == 400 and huge.json()["code"] == "INVALID_ARGUMENT" and "too big" in huge.json()["message"]
    wide = _run(serve_stack, "SELECT zeroblob(900000), printf('%.*c', 900000, 'x') FROM t LIMIT 20")
    body = wide.json()
    assert wide.status_code == 200 and body["truncated"] is True
    assert len(wide.content) < 270_000  # execute_total_bytes (256 KiB) plus JSON punctuation
    assert all(cell.endswith("…") and len(cell.encode()) <= 4096 + 3 for row in body["rows"] for cell in row)
    small = _run(serve_stack, "SELECT id, name FROM t ORDER BY id LIMIT 3")
    assert small.json() == {"columns": ["id", "name"], "rows": [[0, "row 0"], [1, "row 1"], [2, "row 2"]],
                            "truncated": False}


SLOW_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def test_heavy_executes_do_not_hold_the_other_tenant(make_gateway):
    stack = make_gateway(execute_timeout_s=3.0)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        alice = [pool.submit(_run, stack, SLOW_SQL) for _ in range(6)]
        time.sleep(0.5)  # alice's Runs hold her slots
        bob = _run(stack, "SELECT 1", headers=BOB)
        alice_pending_when_bob_done = sum(not f.done() for f in alice)
        codes = sorted(f.result().json()["code"] for f in alice)
    assert bob.json()["rows"] == [[1]]
    assert alice_pending_when_bob_done >= 1
    # two run, two wait, the rest are refused at once; those that ran hit the deadline
    assert codes == ["CANCELLED"] * 4 + ["RESOURCE_EXHAUSTED"] * 2


def test_deeply_nested_json_is_invalid_argument(serve_stack):
    nested = "[" * 5000 + "]" * 5000
    r = httpx.post(f"{serve_stack.http_url}/v1/complete", content=nested, headers=ALICE, timeout=30)
    assert (r.status_code, r.json()["code"]) == (400, "INVALID_ARGUMENT")
    with ws_connect(serve_stack) as ws:
        assert recv(ws)["type"] == "ready"
        ws.send(nested)
        error, _ = recv_until(ws, {"error"})
    assert error["code"] == "INVALID_ARGUMENT"


def _raw_type(stack, frames, until=lambda response: False, timeout=30) -> list:
    """A Type stream of raw frames (bytes, sent as they are); its responses up to `until` (or the end)."""
    out = []
    with grpc.insecure_channel(stack.grpc_target) as channel:
        call = channel.stream_stream("/headstart.v1.Headstart/Type", request_serializer=lambda b: b,
                                     response_deserializer=headstart_pb2.TypeResponse.FromString)
        for response in call(iter(frames), metadata=(("authorization", "Bearer tok-alice"),), timeout=timeout):
            out.append(response)
            if until(response):
                break
    return out


def test_grpc_invalid_utf8_is_a_typed_error_and_the_stream_goes_on(serve_stack):
    open_frame = headstart_pb2.TypeRequest(open=headstart_pb2.OpenStream(db="world_1")).SerializeToString()
    good = headstart_pb2.TypeRequest(input=headstart_pb2.Input(seq=2, text="How AB")).SerializeToString()
    bad = good.replace(b"AB", b"\xff\xfe").replace(b"\x08\x02", b"\x08\x01")  # seq 1, invalid UTF-8

    caught_up = threading.Event()

    def frames():
        yield open_frame
        yield bad
        yield good
        caught_up.wait(30)  # stay open until the answer to `good` came back

    def until(response) -> bool:
        if response.WhichOneof("kind") == "progress" and response.progress.seq == 2:
            caught_up.set()
        return caught_up.is_set()

    responses = _raw_type(serve_stack, frames(), until=until)
    seen = [r.error.code if r.WhichOneof("kind") == "error" else r.WhichOneof("kind") for r in responses]
    assert seen[0] == "ready" and "INVALID_ARGUMENT" in seen and seen[-1] == "progress"


def test_grpc_oversize_message_carries_the_code_trailer(serve_stack):
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stub = headstart_pb2_grpc.HeadstartStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.OpenSession(headstart_pb2.OpenSessionRequest(db="x" * 20000),
                             metadata=(("authorization", "Bearer tok-alice"),), timeout=30)
    assert dict(err.value.trailing_metadata())[CODE_METADATA_KEY] == "MESSAGE_TOO_LARGE"


def test_type_stream_without_open_is_not_held(make_gateway):
    stack = make_gateway(type_open_timeout_s=0.5)
    never = threading.Event()

    def frames():
        never.wait(30)  # a client that connects and never sends
        yield from ()

    with pytest.raises(grpc.RpcError) as err:
        _raw_type(stack, frames(), timeout=20)
    never.set()
    assert dict(err.value.trailing_metadata())[CODE_METADATA_KEY] == "INVALID_ARGUMENT"
    assert "open" in err.value.details()


def test_rest_disconnect_cancels_generation(make_gateway):
    stack = make_gateway()
    body = {"db": "world_1", "question": "List every country name and its population", "max_new_tokens": 512}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{stack.http_url}/v1/complete", json=body, headers=ALICE, timeout=httpx.Timeout(30, read=0.3))
    end = time.monotonic() + 30
    while _metric(stack, "headstart_gateway_completions_total", outcome="cancelled") < 1:
        assert time.monotonic() < end, "the completion was not cancelled"
        time.sleep(0.1)
    assert _metric(stack, "headstart_gateway_completions_total", outcome="done") == 0
    assert _metric(stack, "headstart_gateway_client_disconnects_total", edge="rest") == 1


def test_second_attach_takes_over_and_tells_the_first(serve_stack):
    sid = httpx.post(f"{serve_stack.http_url}/v1/sessions", json={"db": "world_1"}, headers=ALICE,
                     timeout=60).json()["session_id"]
    try:
        with ws_connect(serve_stack, session=sid) as first:
            assert recv(first)["type"] == "ready"
            with ws_connect(serve_stack, session=sid) as second:
                assert recv(second)["type"] == "ready"
                moved, _ = recv_until(first, {"error"})
                with pytest.raises(Exception):
                    recv(first, 5)
                second.send(json.dumps({"type": "input", "seq": 1, "text": "How many"}))
                progress, _ = recv_until(second, {"progress"})
                while progress["seq"] != 1:
                    progress, _ = recv_until(second, {"progress"})
    finally:
        httpx.delete(f"{serve_stack.http_url}/v1/sessions/{sid}", headers=ALICE)
    assert (moved["code"], first.close_code) == ("SESSION_MOVED", 4409)


def test_long_db_on_websocket_is_a_typed_close(serve_stack):
    with ws_connect(serve_stack, db="d" * 600) as ws:
        message = recv(ws)
        with pytest.raises(Exception):
            recv(ws, 5)
    assert (message["code"], ws.close_code) == ("NOT_FOUND", 4404)


def test_rest_errors_are_counted(make_gateway):
    stack = make_gateway()
    before = _metric(stack, "headstart_gateway_errors_total", edge="rest", code="NOT_FOUND")
    httpx.post(f"{stack.http_url}/v1/sessions", json={"db": "nope"}, headers=ALICE, timeout=30)
    httpx.post(f"{stack.http_url}/v1/complete", content="[" * 5000, headers=ALICE, timeout=30)
    assert _metric(stack, "headstart_gateway_errors_total", edge="rest", code="NOT_FOUND") == before + 1
    assert _metric(stack, "headstart_gateway_errors_total", edge="rest", code="INVALID_ARGUMENT") == 1
