"""`headstart loadtest mixed --faults node-kill` on random:tiny (float64): the local stack on two Ray
nodes (services/local_cluster.py), one replica each; halfway through, every process of the worker
node is SIGKILLed. Every typed session open at the kill continues on the head's replica, every
typed answer equals a cold run of its question, no acknowledged row is lost and every failed
request carries an API code (issue 45). Skipped where network namespaces cannot be made."""

from __future__ import annotations

import json

import pytest

from services.local_cluster import netns_unavailable
from tests.test_loadtest import _run_loadtest

pytestmark = pytest.mark.slow


def test_mixed_run_survives_the_loss_of_a_ray_node(tmp_path):
    why = netns_unavailable()
    if why:
        pytest.skip(f"--faults node-kill needs network namespaces: {why}")
    out = _run_loadtest(tmp_path, "mixed", "--users", "12", "--time", "40s", "--max-new-tokens", "8",
                        "--dtype", "float64", "--db", "world_1", "--db", "pets_1", "--faults", "node-kill")
    faults = json.loads((out / "loadtest.json").read_text())["meta"]["faults"]
    (kill,) = faults["injected"]
    assert kill["kind"] == "node-kill" and kill["killed"] and kill["processes"] > 0
    sessions = faults["sessions"]
    assert sessions["through_kill"] >= 1, sessions  # typists type without a break: some session spans it
    assert sessions["lost"] == 0 and sessions["continued"] == sessions["through_kill"], sessions
    assert sessions["answered"] > 0 and sessions["identical"] == sessions["answered"], sessions
    assert faults["acked"]["acked_rows"] > 0 and faults["acked"]["lost_rows"] == 0
    assert faults["errors"]["untyped"] == 0, faults["errors"]
    assert "typed sessions open at the kill" in (out / "loadtest.md").read_text()


def test_an_openai_shaped_code_is_typed_and_a_transport_error_is_not():
    from loadtest.faults import typed_errors

    def failed(code):
        return {"user": "u", "name": "answer", "error": "ApiError", "code": code}

    samples = [failed("UNAVAILABLE"), failed("unavailable"), failed("rate_limit_exceeded"), failed(None),
               failed("Socket closed"), {"user": "u", "name": "answer", "error": None, "code": None}]
    got = typed_errors(samples)
    assert got["errors"] == 5 and got["untyped"] == 2, got
