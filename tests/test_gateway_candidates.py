"""services/gateway/candidates.py: what a client's `candidates` may be, and the `choice` as JSON
(logic only; every edge end to end: tests/test_serve_candidates.py)."""

from __future__ import annotations

import json

import pytest

from headstart.client.errors import ApiError
from headstart.v1 import types_pb2
from services.gateway.candidates import candidates_from_json, check_limits, checked_candidates, choice_json, is_greedy
from services.gateway.settings import GatewaySettings


@pytest.mark.parametrize("value, expected", [
    (None, None),
    (4, types_pb2.CandidatesRequest(k=4)),
    ({"k": 2, "temperature": 0.5, "seed": 9, "wait_all": True},
     types_pb2.CandidatesRequest(k=2, temperature=0.5, seed=9, wait_all=True)),
])
def test_good_values(value, expected):
    assert candidates_from_json(value, 8) == expected


@pytest.mark.parametrize("value", [0, 9, -1, 2.0, "2", True, [2], {"k": 2, "temperature": 0}, {"k": 2, "seed": 1.5},
                                   {"k": 2, "temperature": float("nan")}, {"k": None}, {"k": 2, "x": 1}])
def test_bad_values_are_invalid_argument(value):
    with pytest.raises(ApiError) as exc:
        candidates_from_json(value, 8)
    assert exc.value.code == "INVALID_ARGUMENT"


def test_candidates_need_the_greedy_answer():
    greedy, sampled = types_pb2.SamplingParams(max_new_tokens=8), types_pb2.SamplingParams(temperature=0.7)
    assert is_greedy(greedy) and not is_greedy(sampled) and not is_greedy(types_pb2.SamplingParams(logprobs=True))
    assert checked_candidates(types_pb2.CandidatesRequest(k=3), 8, greedy).k == 3
    assert checked_candidates(types_pb2.CandidatesRequest(k=1), 8, sampled).k == 1  # one: nothing is checked
    with pytest.raises(ApiError, match="greedy"):
        checked_candidates(types_pb2.CandidatesRequest(k=3), 8, sampled)


def test_choice_json_and_the_run_limits():
    choice = types_pb2.Choice(seq=3, index=2, sql="SELECT 1", columns=["1"], rows_json=json.dumps([[1]]),
                              truncated=True, num_rows=40, agreed=2, num_candidates=4,
                              failed=[types_pb2.FailedCandidate(index=1, error="no such column")])
    assert choice_json(choice) == {"seq": 3, "index": 2, "sql": "SELECT 1", "columns": ["1"], "rows": [[1]],
                                   "truncated": True, "num_rows": 40, "agreed": 2, "num_candidates": 4,
                                   "failed": [{"index": 1, "error": "no such column"}], "error": None}
    limits = check_limits(GatewaySettings(execute_row_limit=7, execute_timeout_s=2.5, execute_cell_bytes=99))
    assert (limits.rows, limits.timeout_s, limits.cell_chars) == (7, 2.5, 99)
