"""Integration: execution-checked answers on every edge of the real stack (gateway, Ray Serve,
2 replicas, random:tiny float64). The greedy tokens stream as before (a cold run's tokens), the
Result says how many candidates were decoded, then one `choice` carries the chosen SQL, its rows,
the agreement and the failed candidates; with candidates = 1 nothing changes; bad values are
typed errors on the edge that took them.

Random weights write no SQL that runs, so every candidate fails here and the greedy answer stands
with its error; the rows of a choice whose SQL ran: tests/test_engine_checked_stream.py (and the
browser test on the trained model, tests/test_browser_candidates.py).
"""

from __future__ import annotations

import json

import httpx
import pytest

from headstart.client import ApiError, HeadstartClient
from headstart.v1 import types_pb2
from tests.serve_fixture import SERVED_MODEL
from tests.serve_helpers import MAX_NEW, recv, recv_until, ws_connect
from tests.typing_traces import QUESTIONS

pytestmark = pytest.mark.slow
QUESTION = QUESTIONS[0]
K = 3


@pytest.fixture(scope="module")
def cold(tiny_runtime):
    return tiny_runtime.complete("world_1", QUESTION, "cold", MAX_NEW)


def _assert_choice(choice: dict, k: int, seq: int | None = None) -> None:
    """A choice of random weights' candidates: every one failed, the greedy answer stands."""
    assert choice["num_candidates"] >= 1 and choice["num_candidates"] <= k
    assert choice["index"] == 0 and choice["agreed"] == 0 and choice["error"]
    assert sorted(f["index"] for f in choice["failed"]) == list(range(choice["num_candidates"]))
    assert choice["rows"] == [] and choice["columns"] == [] and choice["truncated"] is False
    if seq is not None:
        assert choice["seq"] == seq


def _ws_submit(ws, seq: int, **extra) -> tuple[dict, list[dict]]:
    ws.send(json.dumps({"type": "input", "seq": seq, "text": QUESTION}))
    ws.send(json.dumps({"type": "submit", "seq": seq + 1, "text": QUESTION, "max_new_tokens": MAX_NEW, **extra}))
    return recv_until(ws, {"done", "error"})


def test_ws_submit_streams_the_greedy_answer_then_its_choice(serve_stack, cold):
    with ws_connect(serve_stack) as ws:
        assert recv(ws)["type"] == "ready"
        done, seen = _ws_submit(ws, 1, candidates=K)
        assert done["type"] == "done", done
        assert done["token_ids"] == cold.token_ids and done["num_candidates"] == K
        assert "".join(m["text"] for m in seen if m["type"] == "token") == done["text"]
        choice, between = recv_until(ws, {"choice", "error"})
        assert choice["type"] == "choice", choice
        assert all(m["type"] == "progress" for m in between)
        _assert_choice(choice, K, seq=2)
        assert choice["sql"] == done["sql"]  # every candidate failed: the greedy SQL stands


def test_ws_session_candidates_from_the_url(serve_stack):
    with ws_connect(serve_stack, db=f"world_1&candidates={K}") as ws:
        assert recv(ws)["type"] == "ready"
        done, _ = _ws_submit(ws, 1, candidates={"k": 2, "seed": 5, "wait_all": True})  # the submit's own
        assert done["num_candidates"] == 2
        choice, _ = recv_until(ws, {"choice", "error"})
        _assert_choice(choice, 2)
        assert choice["num_candidates"] == 2  # wait_all: every candidate checked
        done, _ = _ws_submit(ws, 3)  # none named: the session's
        assert done["num_candidates"] == K
        assert recv_until(ws, {"choice", "error"})[0]["type"] == "choice"


def test_ws_one_candidate_changes_nothing(serve_stack, cold):
    with ws_connect(serve_stack) as ws:
        assert recv(ws)["type"] == "ready"
        done, _ = _ws_submit(ws, 1, candidates=1)
        assert done["token_ids"] == cold.token_ids and done["num_candidates"] == 0
        # the next message is the next input's progress: no choice came between
        ws.send(json.dumps({"type": "input", "seq": 3, "text": QUESTION + " x"}))
        following, before = recv_until(ws, {"progress", "choice"})
        assert following["type"] == "progress" and before == []


@pytest.mark.parametrize("candidates, words", [
    (0, "between 1 and 8"),
    (9, "between 1 and 8"),
    (-2, "between 1 and 8"),
    ("4", "a count or an object"),
    (True, "a count or an object"),
    ({"k": 2, "temperature": 0}, "temperature"),
    ({"k": 2, "temperature": 3.5}, "temperature"),
    ({"k": 2, "seed": -1}, "seed"),
    ({"k": 2, "wait_all": "yes"}, "wait_all"),
    ({"k": 2, "top_p": 0.5}, "unknown candidates field"),
    ({"temperature": 0.5}, "k must be"),
])
def test_ws_bad_candidates_are_typed_errors(serve_stack, candidates, words):
    with ws_connect(serve_stack) as ws:
        assert recv(ws)["type"] == "ready"
        error, _ = _ws_submit(ws, 1, candidates=candidates)
        assert error["type"] == "error" and error["code"] == "INVALID_ARGUMENT" and words in error["message"]
        done, _ = _ws_submit(ws, 3)  # the connection goes on
        assert done["type"] == "done"


def test_ws_bad_url_candidates_refuse_the_connection(serve_stack):
    with ws_connect(serve_stack, db="world_1&candidates=99") as ws:
        message = recv(ws)
        assert message["type"] == "error" and message["code"] == "INVALID_ARGUMENT"


def test_rest_complete_returns_the_choice(serve_stack, cold):
    headers = {"authorization": "Bearer tok-alice"}
    body = {"db": "world_1", "question": QUESTION, "max_new_tokens": MAX_NEW, "candidates": {"k": K, "seed": 1}}
    r = httpx.post(f"{serve_stack.http_url}/v1/complete", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["token_ids"] == cold.token_ids and answer["num_candidates"] == K
    _assert_choice(answer["choice"], K, seq=0)
    plain = httpx.post(f"{serve_stack.http_url}/v1/complete", json={**body, "candidates": 1}, headers=headers,
                       timeout=120).json()
    assert "choice" not in plain and plain["token_ids"] == cold.token_ids
    bad = httpx.post(f"{serve_stack.http_url}/v1/complete", json={**body, "candidates": 0}, headers=headers,
                     timeout=120)
    assert bad.status_code == 400 and bad.json()["code"] == "INVALID_ARGUMENT"


def test_rest_session_with_candidates(serve_stack):
    headers = {"authorization": "Bearer tok-alice"}
    r = httpx.post(f"{serve_stack.http_url}/v1/sessions", json={"db": "world_1", "candidates": 2},
                   headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    sid = r.json()["session_id"]
    try:
        with ws_connect(serve_stack, session=sid) as ws:
            assert recv(ws)["type"] == "ready"
            done, _ = _ws_submit(ws, 1)
            assert done["num_candidates"] == 2
            assert recv_until(ws, {"choice", "error"})[0]["type"] == "choice"
    finally:
        httpx.delete(f"{serve_stack.http_url}/v1/sessions/{sid}", headers=headers, timeout=30)
    bad = httpx.post(f"{serve_stack.http_url}/v1/sessions", json={"db": "world_1", "candidates": 17},
                     headers=headers, timeout=120)
    assert bad.status_code == 400


def test_grpc_complete_and_typing_carry_the_choice(serve_stack, cold):
    with HeadstartClient(serve_stack.grpc_target, token="tok-alice") as client:
        answer = client.complete_checked("world_1", QUESTION, candidates=K, max_new_tokens=MAX_NEW)
        assert list(answer.result.token_ids) == cold.token_ids and answer.result.num_candidates == K
        assert answer.choice is not None and answer.choice.agreed == 0 and answer.choice.error
        assert answer.sql == answer.result.sql and answer.rows == []
        plain = client.complete_checked("world_1", QUESTION, candidates=1, max_new_tokens=MAX_NEW)
        assert plain.choice is None and list(plain.result.token_ids) == cold.token_ids
        with client.typing("world_1", candidates=2) as session:
            session.input(QUESTION)
            checked = session.submit_checked(QUESTION, max_new_tokens=MAX_NEW)
            assert checked.result.num_candidates == 2 and checked.choice.num_candidates >= 1
            assert list(checked.result.token_ids) == cold.token_ids
            again = session.submit_checked(QUESTION, candidates={"k": 3, "wait_all": True}, max_new_tokens=MAX_NEW)
            assert again.choice.num_candidates == 3 and again.choice.seq == session.seq
        with pytest.raises(ApiError) as exc:
            client.complete_checked("world_1", QUESTION, candidates=types_pb2.CandidatesRequest(k=99))
        assert exc.value.code == "INVALID_ARGUMENT"
        with client.typing("world_1") as session:
            with pytest.raises(ApiError) as exc:
                session.submit_checked(QUESTION, candidates={"k": 2, "temperature": float("inf")})
            assert exc.value.code == "INVALID_ARGUMENT"


def test_grpc_type_stream_half_closed_after_submit_still_gets_the_choice(serve_stack):
    from headstart.v1 import headstart_pb2, headstart_pb2_grpc
    import grpc

    requests = [
        headstart_pb2.TypeRequest(open=headstart_pb2.OpenStream(db="world_1")),
        headstart_pb2.TypeRequest(submit=headstart_pb2.Submit(
            seq=1, text=QUESTION, params=types_pb2.SamplingParams(max_new_tokens=MAX_NEW),
            candidates=types_pb2.CandidatesRequest(k=2))),
    ]
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stub = headstart_pb2_grpc.HeadstartStub(channel)
        kinds = [r.WhichOneof("kind") for r in stub.Type(iter(requests), timeout=120,
                                                         metadata=(("authorization", "Bearer tok-alice"),))]
    assert kinds[-2:] == ["result", "choice"], kinds


def _openai(stack):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{stack.http_url}/v1", api_key="tok-alice", max_retries=0, timeout=120)


def test_openai_takes_candidates_as_an_extra_field(serve_stack, cold):
    client = _openai(serve_stack)
    messages = [{"role": "user", "content": QUESTION}]
    response = client.chat.completions.create(model=SERVED_MODEL, max_tokens=MAX_NEW, messages=messages,
                                              extra_body={"database": "world_1", "candidates": K})
    assert len(response.choices) == 1  # n keeps its OpenAI meaning
    assert response.choices[0].message.content == cold.text
    _assert_choice(response.model_extra["choice"], K)
    chunks = list(client.chat.completions.create(model=SERVED_MODEL, max_tokens=MAX_NEW, messages=messages,
                                                 stream=True, extra_body={"database": "world_1", "candidates": K}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cold.text
    last = chunks[-1]
    assert last.choices == [] and last.model_extra["choice"]["num_candidates"] >= 1


@pytest.mark.parametrize("extra, words", [
    ({"candidates": 0}, "between 1 and"),
    ({"candidates": 9}, "between 1 and 8"),
    ({"candidates": 2, "n": 2}, "n must be 1"),
    ({"candidates": 2, "temperature": 0.5}, "greedy"),
    ({"candidates": {"k": 2, "temperature": -1}}, "temperature"),
])
def test_openai_bad_candidates_are_400s_naming_the_field(serve_stack, extra, words):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as exc:
        _openai(serve_stack).chat.completions.create(
            model=SERVED_MODEL, max_tokens=MAX_NEW, messages=[{"role": "user", "content": QUESTION}],
            extra_body={"database": "world_1", **extra})
    error = exc.value.body
    assert error["param"] == "candidates" and words in error["message"], error


def test_metrics_count_the_checked_answers(serve_stack):
    def failed() -> float:
        text = httpx.get(f"{serve_stack.http_url}/metrics", timeout=30).text
        line = next((x for x in text.splitlines()
                     if x.startswith('headstart_gateway_checked_answers_total{outcome="failed"}')), None)
        return float(line.split()[-1]) if line else 0.0

    before = failed()
    body = {"db": "world_1", "question": QUESTION, "max_new_tokens": MAX_NEW, "candidates": 2}
    r = httpx.post(f"{serve_stack.http_url}/v1/complete", json=body, headers={"authorization": "Bearer tok-alice"},
                   timeout=120)
    assert r.status_code == 200 and r.json()["choice"]["error"]
    assert failed() == before + 1
