"""Integration (issue 29, item 7): cancellation from the first byte, and the contract gaps.

Cancellation is measured in replica work: the tokens the replicas' forward
passes computed (`EngineSessionInfo.forward_tokens`) while a client asked
for 512 answer tokens and left 20 ms after sending its request, on a
database no request has used yet, so the replica is still preparing the
prompt (its P0) when the client leaves. A full answer costs over 512 such
tokens; a request cancelled in time costs its prompt's remainder at most.
On the old engine the request it queued after the cancellation arrived ran
to its end unread (521 of 521 tokens), on REST and gRPC `Complete` alike;
the OpenAI edge never noticed a client that left at all.

Contracts: a WebSocket's `Authorization` header beats its `?token=`; a seq
of 2^62-1 is refused instead of wedging the session; gRPC refuses
temperature NaN and top_p 5 (it took and ignored them); the OpenAI edge
answers `[` x 8000 with a 400, not a 500 RecursionError.
"""

from __future__ import annotations

import json
import math
import socket
import time

import grpc
import httpx
import pytest
from websockets.sync.client import connect

from headstart.client.errors import CODE_METADATA_KEY
from headstart.v1 import engine_pb2, engine_pb2_grpc, headstart_pb2, headstart_pb2_grpc, types_pb2
from tests.serve_helpers import recv, recv_until

pytestmark = pytest.mark.slow
LONG = 512  # the gateway's max_new_tokens limit
ALICE = (("authorization", "Bearer tok-alice"),)
QUESTION = "How many are there?"


def _replica_work(serve_engine) -> tuple[int, int]:
    """(forward tokens of both replicas together, jobs queued or running on them)."""
    seen = {}
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        for i in range(12):  # routed by id: a dozen reach both replicas
            info = stub.Describe(engine_pb2.EngineSessionRef(), metadata=serve_engine.metadata(f"work-{i}"),
                                 timeout=30)
            seen[info.replica] = (info.forward_tokens, info.num_queued)
    assert len(seen) == 2
    return sum(t for t, _ in seen.values()), sum(q for _, q in seen.values())


def _settled_work(serve_engine, polls: int = 10) -> int:
    """The replicas' forward tokens once nothing has been queued or running for `polls` polls."""
    idle, tokens = 0, 0
    while idle < polls:
        tokens, busy = _replica_work(serve_engine)
        idle = 0 if busy else idle + 1
    return tokens


def _post_and_leave(url: str, path: str, body: dict) -> None:
    """Send the whole request, then close the connection 20 ms later (before any answer)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer tok-alice\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        time.sleep(0.02)


def _grpc_and_leave(stack, db: str) -> None:
    with grpc.insecure_channel(stack.grpc_target) as channel:
        call = headstart_pb2_grpc.HeadstartStub(channel).Complete(headstart_pb2.CompleteRequest(
            db=db, question=QUESTION, params=types_pb2.SamplingParams(max_new_tokens=LONG)), metadata=ALICE)
        time.sleep(0.02)
        call.cancel()


LEAVES = {
    "rest": ("student_transcripts_tracking",
             lambda s, db: _post_and_leave(s.http_url, "/v1/complete", {"db": db, "question": QUESTION,
                                                                        "max_new_tokens": LONG})),
    "grpc": ("dog_kennels", _grpc_and_leave),
    "openai": ("real_estate_properties",
               lambda s, db: _post_and_leave(s.http_url, "/v1/chat/completions", {
                   "model": f"headstart/{db}", "max_tokens": LONG,
                   "messages": [{"role": "user", "content": QUESTION}]})),
    "openai-stream": ("cre_Doc_Template_Mgt",
                      lambda s, db: _post_and_leave(s.http_url, "/v1/completions", {
                          "model": f"headstart/{db}", "max_tokens": LONG, "prompt": QUESTION, "stream": True})),
}


@pytest.mark.parametrize("edge", list(LEAVES))
def test_a_client_leaving_at_once_stops_the_replicas_work(serve_stack, serve_engine, edge):
    db, leave = LEAVES[edge]
    before = _settled_work(serve_engine)
    leave(serve_stack, db)
    spent = _settled_work(serve_engine) - before
    # the same request answered in full, for scale
    with httpx.Client(base_url=serve_stack.http_url, timeout=120) as http:
        r = http.post("/v1/complete", json={"db": db, "question": QUESTION, "max_new_tokens": LONG},
                      headers=dict(ALICE))
        assert len(r.json()["token_ids"]) == LONG  # random weights never stop early
    full = _settled_work(serve_engine) - before - spent
    print(f"\n{edge}: a client that left cost {spent} forward tokens; the full answer {full}")
    assert full > LONG and spent < LONG // 4, (spent, full)


def test_the_authorization_header_beats_the_query_token(serve_stack):
    with httpx.Client(base_url=serve_stack.http_url, timeout=60) as http:
        sid = http.post("/v1/sessions", json={"db": "world_1"}, headers=dict(ALICE)).json()["session_id"]
        try:
            url = f"{serve_stack.ws_url}/v1/sessions/ws?session={sid}&token=tok-bob"
            with connect(url, additional_headers=dict(ALICE), open_timeout=30) as ws:
                assert recv(ws)["type"] == "ready"  # alice's, by her header (bob's token named nothing of his)
            with connect(url.replace("tok-bob", "tok-alice"), additional_headers={"authorization": "Bearer nope"},
                         open_timeout=30) as ws:
                assert recv(ws)["code"] == "UNAUTHENTICATED"  # the header counts, even when the URL is right
        finally:
            http.delete(f"/v1/sessions/{sid}", headers=dict(ALICE))


def test_a_huge_seq_is_refused_and_does_not_wedge_the_session(serve_stack):
    with connect(f"{serve_stack.ws_url}/v1/sessions/ws?db=world_1&token=tok-alice", open_timeout=30) as ws:
        assert recv(ws)["type"] == "ready"
        ws.send(json.dumps({"type": "input", "seq": 2**62 - 1, "text": "How many"}))
        error, _ = recv_until(ws, {"error"})
        assert error["code"] == "INVALID_ARGUMENT" and "2^32" in error["message"]
        for seq, text in enumerate(["How", "How many", "How many cities?"], 1):
            ws.send(json.dumps({"type": "input", "seq": seq, "text": text}))
        ws.send(json.dumps({"type": "submit", "seq": 4, "text": "How many cities?", "max_new_tokens": 3}))
        done, seen = recv_until(ws, {"done", "error"})
        assert done["type"] == "done" and done["seq"] == 4, (done, seen)


@pytest.mark.parametrize("temperature, top_p", [(math.nan, 0.0), (math.inf, 0.0), (-0.5, 0.0), (0.0, 5.0),
                                                (0.0, math.nan), (0.0, -1.0)])
def test_grpc_refuses_sampling_out_of_range(serve_stack, temperature, top_p):
    params = types_pb2.SamplingParams(max_new_tokens=3, temperature=temperature, top_p=top_p)
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stub = headstart_pb2_grpc.HeadstartStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Complete(headstart_pb2.CompleteRequest(db="world_1", question=QUESTION, params=params),
                               metadata=ALICE, timeout=60))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(info.value.trailing_metadata())[CODE_METADATA_KEY] == "INVALID_ARGUMENT"
        # in a typing stream, the submit is refused in-stream and the stream goes on
        requests = [headstart_pb2.TypeRequest(open=headstart_pb2.OpenStream(db="world_1")),
                    headstart_pb2.TypeRequest(submit=headstart_pb2.Submit(seq=1, text=QUESTION, params=params))]
        responses = list(stub.Type(iter(requests), metadata=ALICE, timeout=60))
        kinds = [r.WhichOneof("kind") for r in responses]
        # the session's progress messages may come before or after the error: its order is not the contract
        errors = [r.error.code for r in responses if r.WhichOneof("kind") == "error"]
        assert kinds[0] == "ready" and errors == ["INVALID_ARGUMENT"] and "result" not in kinds, responses


def test_grpc_honours_sampling_in_range(serve_stack):
    params = types_pb2.SamplingParams(max_new_tokens=6, temperature=1.5, top_p=0.9, seed=7)
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stub = headstart_pb2_grpc.HeadstartStub(channel)

        def tokens(p):
            out = list(stub.Complete(headstart_pb2.CompleteRequest(db="world_1", question=QUESTION, params=p),
                                     metadata=ALICE, timeout=60))
            return list(out[-1].result.token_ids)

        greedy = tokens(types_pb2.SamplingParams(max_new_tokens=6))
        sampled = tokens(params)
        assert sampled == tokens(params) and sampled != greedy  # seeded: repeatable, and not the greedy answer


def test_openai_edge_answers_deep_nesting_with_a_400(serve_stack):
    with httpx.Client(base_url=serve_stack.http_url, timeout=60) as http:
        r = http.post("/v1/chat/completions", content=b"[" * 8000, headers={**dict(ALICE),
                                                                            "content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_json"
