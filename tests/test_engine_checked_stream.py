"""A replica's checked answers (services/engine/checks.py) without Ray: a session stream's submit
with candidates streams the greedy answer's tokens and Result, then one Choice; with k = 1 nothing
changes; bad values are typed errors. The Choice's rows are a real Run's on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from headstart.candidates import Candidate, CandidateLimits, CandidateRunner, choose
from headstart.paths import default_spider_dir
from headstart.v1 import engine_pb2, types_pb2
from services.engine.checks import candidates_of, choice_message, limits_of
from services.engine.core import ReplicaCore
from services.engine.stream import SessionStream

QUESTION = "How many countries?"
MAX_NEW = 6
WORLD = default_spider_dir() / "database" / "world_1" / "world_1.sqlite"


@pytest.fixture
def core(tiny_runtime):
    core = ReplicaCore(tiny_runtime.settings, max_attached=2, runtime=tiny_runtime)
    yield core
    core.close("a")
    core.checks.close()


async def _run_stream(core, requests, until) -> list[engine_pb2.EngineEvent]:
    queue: asyncio.Queue = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)

    async def source():
        while True:
            yield await queue.get()

    out = []
    stream = SessionStream(core, "replica-x").run(source())
    async for event in stream:
        out.append(event)
        if until(event):
            break
    await stream.aclose()
    return out


def _submit_events(core, candidates: types_pb2.CandidatesRequest | None, until_kinds=("choice", "error"),
                   attach_candidates: types_pb2.CandidatesRequest | None = None):
    requests = [
        engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="a", db="world_1", seq=1, text=QUESTION,
                                                          candidates=attach_candidates)),
        engine_pb2.EngineRequest(submit=engine_pb2.EngineSubmit(
            seq=2, text=QUESTION, params=types_pb2.SamplingParams(max_new_tokens=MAX_NEW), candidates=candidates,
            check_limits=engine_pb2.CheckLimits(timeout_s=5, rows=3, cell_chars=64))),
    ]
    return asyncio.run(_run_stream(core, requests, lambda e: e.WhichOneof("kind") in until_kinds))


def test_a_submit_with_candidates_streams_the_greedy_answer_then_one_choice(core, tiny_runtime):
    events = _submit_events(core, types_pb2.CandidatesRequest(k=4, seed=7))
    kinds = [e.WhichOneof("kind") for e in events]
    assert kinds[-2:] == ["result", "choice"], kinds
    result, choice = events[-2].result, events[-1].choice
    # the greedy answer is today's answer, token for token
    assert list(result.token_ids) == tiny_runtime.complete("world_1", QUESTION, "cold", MAX_NEW).token_ids
    assert result.num_candidates == 4 and result.seq == 2
    assert choice.seq == 2 and 1 <= choice.num_candidates <= 4
    # random weights write no SQL that runs: every candidate failed, the greedy answer stands with its error
    assert choice.index == 0 and choice.agreed == 0 and choice.error
    assert sorted(f.index for f in choice.failed) == list(range(choice.num_candidates))
    assert all(f.error for f in choice.failed)
    assert json.loads(choice.rows_json) == [] and not choice.columns


def test_wait_all_checks_every_candidate(core):
    events = _submit_events(core, types_pb2.CandidatesRequest(k=3, seed=1, wait_all=True))
    assert events[-1].WhichOneof("kind") == "choice", events[-1]
    assert events[-1].choice.num_candidates == 3


def test_the_sessions_own_candidates_answer_a_submit_that_names_none(core):
    events = _submit_events(core, None, attach_candidates=types_pb2.CandidatesRequest(k=2))
    assert events[-2].result.num_candidates == 2 and events[-1].HasField("choice")


def test_one_candidate_changes_nothing(core):
    events = _submit_events(core, types_pb2.CandidatesRequest(k=1), until_kinds=("result", "error"))
    assert events[-1].WhichOneof("kind") == "result" and events[-1].result.num_candidates == 0


@pytest.mark.parametrize("wire, words", [
    (types_pb2.CandidatesRequest(k=17), "between 1 and 16"),
    (types_pb2.CandidatesRequest(k=-1), "between 1 and 16"),
    (types_pb2.CandidatesRequest(k=4, temperature=0.0), "temperature"),
    (types_pb2.CandidatesRequest(k=4, temperature=float("nan")), "temperature"),
])
def test_bad_candidates_are_typed_errors(core, wire, words):
    events = _submit_events(core, wire, until_kinds=("result", "error"))
    assert events[-1].WhichOneof("kind") == "error"
    assert events[-1].error.code == "INVALID_ARGUMENT" and words in events[-1].error.message
    assert events[-1].error.seq == 2


def test_candidates_of_takes_the_engines_defaults(tiny_runtime):
    settings = tiny_runtime.settings
    assert candidates_of(types_pb2.CandidatesRequest(), settings) is None  # k 0: the default
    params = candidates_of(types_pb2.CandidatesRequest(k=4, seed=3), settings)
    assert (params.k, params.temperature, params.top_p, params.seed) == (
        4, settings.candidate_temperature, settings.candidate_top_p, 3)
    assert candidates_of(types_pb2.CandidatesRequest(k=2, temperature=0.3), settings).temperature == 0.3
    limits = limits_of(engine_pb2.CheckLimits(rows=5))
    assert (limits.display_rows, limits.timeout_s) == (5, CandidateLimits().timeout_s)


@pytest.mark.skipif(not WORLD.is_file(), reason="Spider's world_1 is not here")
def test_the_choice_carries_the_chosen_sqls_first_rows():
    with sqlite3.connect(f"file:{WORLD}?mode=ro", uri=True) as conn:
        every = conn.execute("SELECT Name FROM country ORDER BY Name").fetchall()
    runner = CandidateRunner(CandidateLimits(display_rows=3, cell_chars=16))
    try:
        sql = "SELECT Name FROM country ORDER BY Name"
        candidates = [Candidate(0, "SELECT nope FROM country", "SELECT nope FROM country"),
                      Candidate(1, sql, sql), Candidate(2, sql, sql), Candidate(3, "SELECT 1", "SELECT 1")]
        choice = choice_message(choose(runner.run(WORLD, candidates)), seq=9)
    finally:
        runner.close()
    assert (choice.seq, choice.index, choice.sql, choice.agreed, choice.num_candidates) == (9, 1, sql, 2, 4)
    assert list(choice.columns) == ["Name"]
    assert json.loads(choice.rows_json) == [[name] for (name,) in every[:3]]
    assert choice.truncated and choice.num_rows == len(every)  # 3 of them shown
    assert [f.index for f in choice.failed] == [0] and "nope" in choice.failed[0].error
    assert choice.error == ""
