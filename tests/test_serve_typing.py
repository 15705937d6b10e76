"""Integration: typing through the real gateway and a real Ray Serve engine
(2 replicas, random:tiny float64) gives exactly the tokens of a cold run."""

from __future__ import annotations

import random
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headstart.client import HeadstartClient
from headstart.client.errors import ApiError
from headstart.engine.requests.generation import SamplingParams
from headstart.v1 import engine_pb2, engine_pb2_grpc
from tests.serve_helpers import MAX_NEW, recv, ws_connect, ws_type_and_submit
from tests.typing_traces import KINDS, QUESTIONS, typed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cold(tiny_runtime):
    memo: dict[str, list[int]] = {}

    def run(text: str) -> list[int]:
        if text not in memo:
            memo[text] = tiny_runtime.complete("world_1", text, "cold", MAX_NEW).token_ids
        return memo[text]

    return run


@pytest.mark.parametrize("kind", ["typos", "mid_edit", "unicode", "paste", "special_tokens"])
def test_grpc_typing_matches_cold(serve_stack, cold, kind):
    rng = random.Random(kind)
    snapshots = KINDS[kind](QUESTIONS[rng.randrange(len(QUESTIONS))], rng)
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        with client.typing("world_1") as session:
            for text in snapshots:
                session.input(text)
            session.wait_caught_up()
            result = session.submit(snapshots[-1], MAX_NEW)
    assert list(result.token_ids) == cold(snapshots[-1])
    assert result.computed_tokens_at_submit <= result.prompt_tokens - result.cached_tokens_at_submit + 1
    assert result.cached_tokens_at_submit > 0


@pytest.mark.parametrize("pause_s", [0.0, 0.01])
def test_ws_typing_matches_cold(serve_stack, cold, pause_s):
    snapshots = typed(QUESTIONS[0])
    with ws_connect(serve_stack) as ws:
        ready = recv(ws)
        assert ready["type"] == "ready" and ready["db"] == "world_1" and len(ready["session"]) == 32
        done, seen = ws_type_and_submit(ws, snapshots, pause_s=pause_s)
    assert done["type"] == "done", done
    assert done["token_ids"] == cold(snapshots[-1])
    assert "".join(m["text"] for m in seen if m["type"] == "token") == done["text"]
    progress = [m for m in seen if m["type"] == "progress"]
    assert progress and all(m["prompt_tokens"] >= m["cached_tokens"] > 0 for m in progress)
    assert set(done) >= {"sql", "ttft_ms", "total_ms", "cached_tokens_at_submit", "computed_tokens_at_submit",
                         "answer_tokens_at_submit"}


def test_typed_prompt_is_nearly_free_at_submit(serve_stack, cold):
    """After a pause the cache holds the question: the submit computes only the
    few tokens of the text the policy held back plus the prompt's tail."""
    question = QUESTIONS[2]
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        with client.typing("world_1") as session:
            session.input(question)
            progress = session.wait_caught_up()
            result = session.submit(question, MAX_NEW)
    assert progress.cached_tokens == progress.prompt_tokens
    assert result.prompt_tokens == progress.prompt_tokens
    assert result.computed_tokens_at_submit <= 1  # the backstep token at most
    assert list(result.token_ids) == cold(question)


@pytest.mark.parametrize("mode", ["cold", "prefix"])
def test_complete_matches_cold(serve_stack, cold, mode):
    with HeadstartClient(serve_stack.grpc_target, token="tok-bob") as client:
        streamed: list[str] = []
        result = client.complete("world_1", QUESTIONS[1], MAX_NEW, mode, on_text=streamed.append)
    assert list(result.token_ids) == cold(QUESTIONS[1])
    assert "".join(streamed) == result.text
    assert result.finish_reason == "length"


def test_complete_with_tables_in_either_order(serve_stack, tiny_runtime):
    """`Complete(tables=...)` prompts with exactly those tables in that order
    (issue 4): each order gives the tokens of a cold run of that same selection."""
    question, params = QUESTIONS[1], SamplingParams(max_new_tokens=MAX_NEW)
    orders = (("country", "city"), ("city", "country"))
    want = {t: tiny_runtime.start_complete("world_1", question, "cold", params, tables=list(t)).result()
            for t in orders}
    with HeadstartClient(serve_stack.grpc_target, token="tok-bob") as client:
        got = {t: client.complete("world_1", question, MAX_NEW, tables=list(t)) for t in orders}
        whole = client.complete("world_1", question, MAX_NEW)
    for t in orders:
        assert list(got[t].token_ids) == want[t].token_ids, t
        assert got[t].prompt_tokens == want[t].prompt_tokens < whole.prompt_tokens
    # NOTE: the two orders are two prompts with two answers (float64: deterministic),
    # so a server that ignored the order would fail one of the equalities above.
    assert want[orders[0]].token_ids != want[orders[1]].token_ids


@pytest.mark.parametrize("tables, named", [
    (["country", "no_such_table"], "no_such_table"),  # the replica's answer
    (["city", "City"], "distinct"),  # the replica's answer
    (["city", ""], "non-empty"),  # the gateway's answer
])
def test_complete_with_bad_tables_is_invalid_argument(serve_stack, tables, named):
    with HeadstartClient(serve_stack.grpc_target, token="tok-bob") as client:
        with pytest.raises(ApiError) as err:
            client.complete("world_1", QUESTIONS[1], MAX_NEW, tables=tables)
    assert err.value.code == "INVALID_ARGUMENT" and named in err.value.message
    rest = httpx.post(f"{serve_stack.http_url}/v1/complete", headers={"authorization": "Bearer tok-bob"},
                      json={"db": "world_1", "question": QUESTIONS[1], "max_new_tokens": MAX_NEW, "tables": tables},
                      timeout=60)
    assert rest.status_code == 400 and rest.json()["code"] == "INVALID_ARGUMENT"


def test_stickiness_through_serve_router(serve_engine):
    """Every call of a session reaches one replica; different sessions spread."""
    md = lambda sid: serve_engine.metadata(sid)  # noqa: E731
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)

        def requests():
            yield engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="sticky-1", db="world_1"))
            for seq in range(1, 21):
                yield engine_pb2.EngineRequest(snapshot=engine_pb2.Snapshot(seq=seq, text="How many"[: seq % 8 + 1]))

        events = list(stub.Session(requests(), metadata=md("sticky-1"), timeout=60))
        acks = [e.ack for e in events if e.WhichOneof("kind") == "ack"]
        attached = [e.attached for e in events if e.WhichOneof("kind") == "attached"]
        infos = [stub.Describe(engine_pb2.EngineSessionRef(session_id="sticky-1"), metadata=md("sticky-1"))
                 for _ in range(10)]
        spread = {stub.Describe(engine_pb2.EngineSessionRef(), metadata=md(f"spread-{i}")).replica for i in range(16)}
        stub.CloseSession(engine_pb2.EngineSessionRef(session_id="sticky-1"), metadata=md("sticky-1"))
    assert [a.seq for a in acks] == list(range(1, 21))
    replicas = {a.replica for a in acks} | {a.replica for a in attached} | {i.replica for i in infos}
    assert len(replicas) == 1
    assert all(i.holds_session for i in infos)
    assert len(spread) == 2


def test_health_reflection_and_metrics(serve_stack, serve_engine):
    assert httpx.get(f"{serve_stack.http_url}/healthz").json()["status"] == "ok"
    for target in (serve_stack.grpc_target, serve_engine.grpc_target):
        with grpc.insecure_channel(target) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        reply = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in reply.list_services_response.service}
    assert {"headstart.v1.Headstart", "grpc.health.v1.Health"} <= names
    metrics = httpx.get(f"{serve_stack.http_url}/metrics").text
    assert "headstart_gateway_snapshot_rtt_seconds_count" in metrics


def test_list_databases_and_run(serve_stack):
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        dbs = {d.id: d for d in client.list_databases()}
    assert (dbs["world_1"].can_execute, dbs["world_1"].num_tables) == (True, 3)
    headers = {"authorization": "Bearer tok-alice"}
    ok = httpx.post(f"{serve_stack.http_url}/v1/execute", headers=headers,
                    json={"db": "world_1", "sql": "SELECT count(*) FROM country"})
    assert ok.status_code == 200 and ok.json() == {"columns": ["count(*)"], "rows": [[239]], "truncated": False}
    denied = httpx.post(f"{serve_stack.http_url}/v1/execute", headers=headers,
                        json={"db": "world_1", "sql": "DELETE FROM country"})
    assert denied.status_code == 400 and denied.json()["code"] == "INVALID_ARGUMENT"


def test_same_replica_across_submits(serve_stack):
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        with client.typing("world_1") as session:
            replicas = []
            for question in QUESTIONS[:3]:
                session.input(question)
                replicas.append(session.submit(question, 4).replica)
                time.sleep(0.01)
    assert len(set(replicas)) == 1


def _kv_samples(text: str, name: str) -> dict[tuple[str, str], float]:
    """{(replica, kind): value} of one KV series in a Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.labels.get("replica", ""), s.labels["kind"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == name}


def test_kv_bytes_in_describe_and_metrics(serve_stack, serve_engine):
    """Describe, the gateway's /metrics and the replica's own Ray metrics report KV bytes used, budget, free."""
    from tests.serve_fixture import KV_BUDGET_BYTES

    bytes_per_token = 2 * 2 * 2 * 8 * 8  # random:tiny float64: layers x (K, V) x kv heads x head dim x 8 bytes
    sid = "kv-bytes-1"
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)

        def requests():
            yield engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id=sid, db="world_1"))
            yield engine_pb2.EngineRequest(snapshot=engine_pb2.Snapshot(seq=1, text="How many countries are there"))

        for event in stub.Session(requests(), metadata=serve_engine.metadata(sid), timeout=60):
            if event.WhichOneof("kind") == "progress" and event.progress.cached_tokens == event.progress.prompt_tokens:
                break
        # Describe reads the caches live: taken while the replica's worker is in
        # a forward (another test's data session ingesting, answer-ahead), a
        # layer can show its new keys before its values, and work queued then
        # (this session's answer-ahead, another test's session) changes the
        # bytes between two readings. Read at a quiet moment: nothing queued and
        # no token forwarded across two readings, whole tokens only.
        ref = engine_pb2.EngineSessionRef(session_id=sid)
        for _ in range(200):
            first = stub.Describe(ref, metadata=serve_engine.metadata(sid))
            time.sleep(0.05)
            held = stub.Describe(ref, metadata=serve_engine.metadata(sid))
            if (held.num_queued == 0 and held.forward_tokens == first.forward_tokens
                    and held.kv_used_bytes % bytes_per_token == 0 and held.kv_shared_bytes % bytes_per_token == 0):
                break
        stub.CloseSession(ref, metadata=serve_engine.metadata(sid))
        closed = stub.Describe(ref, metadata=serve_engine.metadata(sid))
    assert held.holds_session and held.cached_tokens > 0
    assert held.kv_budget_bytes == KV_BUDGET_BYTES
    assert 0 < held.kv_shared_bytes < held.kv_used_bytes  # world_1's P0, and the session's own tokens past it
    assert held.kv_used_bytes % bytes_per_token == 0 and held.kv_shared_bytes % bytes_per_token == 0
    assert held.HasField("kv_free_bytes") and held.kv_free_bytes == KV_BUDGET_BYTES - held.kv_used_bytes
    assert closed.replica == held.replica and not closed.holds_session
    # the closed session's tokens are freed: used drops, but for what tokens forwarded
    # since the quiet reading (another session's work) may have added
    grown = (closed.forward_tokens - held.forward_tokens) * bytes_per_token
    assert closed.kv_used_bytes < held.kv_used_bytes + grown
    # the block pool: P0's blocks listed by the store and the session; the pool holds at least what is listed
    assert held.kv_block_tokens > 0 and 0 < held.kv_blocks_shared < held.kv_blocks_used <= held.kv_blocks_total
    assert held.kv_blocks_used * held.kv_block_tokens * bytes_per_token >= held.kv_used_bytes - held.kv_data_bytes

    # The gateway: each replica it reached, by kind (a scrape probes a few replicas at random).
    for _ in range(20):
        seen = _kv_samples(httpx.get(f"{serve_stack.http_url}/metrics").text, "headstart_engine_kv_bytes")
        if (held.replica, "budget") in seen:
            break
    assert seen[(held.replica, "budget")] == KV_BUDGET_BYTES
    assert seen[(held.replica, "used")] > 0
    assert seen[(held.replica, "used")] + seen[(held.replica, "free")] == KV_BUDGET_BYTES

    # The replica's own series, exported by Ray on the node's metrics port (refreshed by Serve's health check).
    import ray

    port = ray._private.worker._global_node.metrics_export_port
    deadline = time.monotonic() + 90
    replica_series: dict = {}
    while time.monotonic() < deadline:
        replica_series = _kv_samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text,
                                     "ray_headstart_engine_kv_bytes")
        if len({r for r, kind in replica_series if kind == "budget"}) == 2:
            break
        time.sleep(2)
    budgets = {r: v for (r, kind), v in replica_series.items() if kind == "budget"}
    assert len(budgets) == 2 and set(budgets.values()) == {KV_BUDGET_BYTES}, replica_series
    assert all(replica_series[(r, "used")] + replica_series[(r, "free")] == KV_BUDGET_BYTES for r in budgets)
