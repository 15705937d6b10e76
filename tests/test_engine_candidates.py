"""Candidate sets: the greedy answer unchanged, the sampled ones reproducible, all rows of one forward.

float64 `random:tiny` (tests/engine_fixture.py): the same logits give the
same samples, so "the same candidates" cannot pass by luck.
"""

from __future__ import annotations

import threading
import time

import pytest

from headstart.engine.errors import InvalidInput
from headstart.engine.requests.candidates import CandidateParams
from headstart.engine.requests.generation import SamplingParams
from headstart.engine.runtime import EngineRuntime
from tests.typing_traces import QUESTIONS

MAX_NEW = 10
PARAMS = SamplingParams(max_new_tokens=MAX_NEW)


def candidate_tokens(runtime, question: str, mode: str, cands: CandidateParams) -> dict[int, tuple[int, ...]]:
    request = runtime.start_complete("world_1", question, mode, PARAMS, candidates=cands)
    cset = request.candidates
    assert cset is not None and cset.wait(120)
    got = {c.index: c.token_ids for c in cset.candidates()}
    assert sorted(got) == list(range(cands.k))
    assert got[0] == tuple(request.result().token_ids)
    return got


def test_greedy_candidate_is_todays_answer(tiny_runtime):
    question = QUESTIONS[0]
    today = tiny_runtime.complete("world_1", question, "cold", MAX_NEW).token_ids
    for mode in ("cold", "prefix"):
        got = candidate_tokens(tiny_runtime, question, mode, CandidateParams(4, seed=3))
        assert list(got[0]) == today


def test_candidates_are_reproducible_and_seeded_per_index(tiny_runtime):
    question = QUESTIONS[1]
    four = candidate_tokens(tiny_runtime, question, "cold", CandidateParams(4, temperature=1.0, seed=11))
    again = candidate_tokens(tiny_runtime, question, "prefix", CandidateParams(4, temperature=1.0, seed=11))
    assert four == again  # another cache origin (P0 shared, not a cold prefill), the same candidates
    two = candidate_tokens(tiny_runtime, question, "cold", CandidateParams(2, temperature=1.0, seed=11))
    assert two == {0: four[0], 1: four[1]}  # K=2's candidates are K=4's first two
    other = candidate_tokens(tiny_runtime, question, "cold", CandidateParams(4, temperature=1.0, seed=12))
    assert other[0] == four[0] and other != four
    assert len({four[i] for i in range(1, 4)} | {four[0]}) > 1  # sampling made other answers
    assert all(len(tokens) <= MAX_NEW for tokens in four.values())


def test_candidate_rows_share_one_forward(tiny_runtime, monkeypatch):
    runner = tiny_runtime.runner
    sizes: list[int] = []
    original = runner.extend_rows

    def counting(rows):
        sizes.append(len(rows))
        return original(rows)

    monkeypatch.setattr(runner, "extend_rows", counting)
    got = candidate_tokens(tiny_runtime, QUESTIONS[2], "cold", CandidateParams(4, temperature=1.0, seed=5))
    monkeypatch.undo()
    greedy, longest = len(got[0]), max(len(t) for i, t in got.items() if i > 0)
    # the greedy answer first, alone (its forwards are not slowed by the samples), then the three sampled
    # ones packed: one forward per token of the longest, not one per candidate's token
    assert sizes[1:1 + greedy - 1] == [1] * (greedy - 1) and max(sizes) == 3
    decode_tokens = sum(len(t) for i, t in got.items() if i > 0)
    assert len(sizes) <= 1 + greedy + longest < 1 + greedy + decode_tokens


def test_another_requests_answer_never_shares_a_forward_with_sampled_candidates(tiny_runtime, monkeypatch):
    """Scheduler rule 2e: request A's samples decode after its greedy answer; request B's greedy
    answer, streaming meanwhile, runs in forwards without them (they made its steps longer)."""
    runner = tiny_runtime.runner
    forwards: list[str] = []
    holder: dict = {}
    original = runner.extend_rows

    def labelled(rows):
        cset, b = holder.get("a"), holder.get("b")
        sampled = {id(c.state) for c in (cset.sampled if cset is not None else ()) if c.state is not None}
        forwards.append("".join("s" if id(r.state) in sampled else "b" if b is not None and r.state is b.state
                                else "o" for r in rows))
        return original(rows)

    monkeypatch.setattr(runner, "extend_rows", labelled)
    a = tiny_runtime.start_complete("world_1", QUESTIONS[2], "prefix", SamplingParams(max_new_tokens=150),
                                    candidates=CandidateParams(4, temperature=1.0, seed=5))
    holder["a"] = a.candidates
    a.result()  # the greedy answer ended: its 3 samples are queued now, 150 tokens each to go
    b = tiny_runtime.start_complete("world_1", QUESTIONS[3], "prefix", PARAMS)
    holder["b"] = b
    assert len(b.result().token_ids) == MAX_NEW
    assert a.candidates.wait(120)
    monkeypatch.undo()
    with_b = [i for i, f in enumerate(forwards) if "b" in f]
    assert with_b and not [f for f in forwards if "b" in f and "s" in f]
    # the samples were decoding while B's answer streamed: they ran before its last step and after it
    assert any("s" in f for f in forwards[:with_b[-1]]) and any("s" in f for f in forwards[with_b[-1]:])


def test_one_candidate_is_todays_request(tiny_runtime):
    request = tiny_runtime.start_complete("world_1", QUESTIONS[0], "cold", PARAMS, candidates=CandidateParams(1))
    assert request.candidates is None
    request.result()


def test_sampled_requests_get_no_candidates(tiny_runtime):
    params = SamplingParams(max_new_tokens=4, temperature=0.5)
    request = tiny_runtime.start_complete("world_1", QUESTIONS[0], "cold", params, candidates=CandidateParams(4))
    assert request.candidates is None  # its answer is no greedy candidate
    request.result()


@pytest.mark.parametrize("bad", [CandidateParams(0), CandidateParams(17), CandidateParams(4, temperature=0.0),
                                 CandidateParams(4, top_p=0.0), CandidateParams(4, temperature=float("nan")),
                                 CandidateParams(4, length_slack=-1)])
def test_bad_candidate_params_are_refused(tiny_runtime, bad):
    with pytest.raises(InvalidInput):
        tiny_runtime.start_complete("world_1", QUESTIONS[0], "cold", PARAMS, candidates=bad)


def test_setting_turns_candidates_on(tmp_path):
    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float32", p0_cache_dir=tmp_path,
                                          candidates=3, candidate_temperature=0.9)
    try:
        request = runtime.start_complete("world_1", QUESTIONS[0], "cold", PARAMS)
        assert request.candidates is not None and request.candidates.params.k == 3
        assert request.candidates.wait(120)
        assert sorted(c.index for c in request.candidates.candidates()) == [0, 1, 2]
        float32_again = runtime.start_complete("world_1", QUESTIONS[0], "cold", PARAMS).candidates
        assert float32_again.wait(120)
        assert [c.token_ids for c in float32_again.candidates()] == [c.token_ids for c in request.candidates.candidates()]
    finally:
        runtime.shutdown()


# -- sessions: candidates decoded during the pause ------------------------------------


def session_candidates(runtime, question: str, cands: CandidateParams, edit: str | None = None,
                       max_new: int = MAX_NEW):
    """Type `question` (after `edit`, if given), pause until the answer-ahead and the pause's candidates
    ran, submit: (the candidates by index, whether the pause's set was handed over)."""
    session = runtime.open_session("world_1", "headstart", candidates=cands)
    try:
        seq = 1
        if edit is not None:
            session.update(seq, edit)
            session.wait_idle(60, speculation=True)
            seq += 1
        session.update(seq, question)
        session.wait_idle(60, speculation=True)
        pause_set = session.candidates._set
        if pause_set is not None:
            pause_set.wait(60)  # nothing attached yet: waits for nothing, sampled ones run on
        request = session.submit(seq + 1, question, SamplingParams(max_new_tokens=max_new), candidates=cands)
        assert request.candidates is not None and request.candidates.wait(120)
        got = {c.index: c.token_ids for c in request.candidates.candidates()}
        assert got[0] == tuple(request.result().token_ids)
        return got, request.candidates is pause_set
    finally:
        runtime.close_session(session.session_id)


def test_session_candidates_match_a_cold_run(tiny_runtime):
    cands = CandidateParams(4, temperature=1.0, seed=21)
    question = QUESTIONS[3]
    cold = candidate_tokens(tiny_runtime, question, "cold", cands)
    # the pause's set forks with the session's answer-ahead budget; a submit of a smaller cap takes it, cut there
    got, handed = session_candidates(tiny_runtime, question, cands)
    assert got == cold and handed
    ahead = tiny_runtime.limits.answer_ahead_tokens
    got, handed = session_candidates(tiny_runtime, question, cands, max_new=ahead)
    assert handed  # the candidates decoded during the pause went on into the answer
    long_cold = tiny_runtime.start_complete("world_1", question, "cold", SamplingParams(max_new_tokens=ahead),
                                            candidates=cands).candidates
    assert long_cold.wait(300)
    assert got == {c.index: c.token_ids for c in long_cold.candidates()}


def test_a_text_change_cancels_the_pause_candidates(tiny_runtime):
    cands = CandidateParams(3, temperature=1.0, seed=2)
    session = tiny_runtime.open_session("world_1", "headstart", candidates=cands)
    try:
        session.update(1, QUESTIONS[0])
        session.wait_idle(60, speculation=True)
        first = session.candidates._set
        assert first is not None and first.forked
        session.update(2, QUESTIONS[1])
        assert session.candidates._set is not first and first._cancelled
    finally:
        tiny_runtime.close_session(session.session_id)
    edited, _ = session_candidates(tiny_runtime, QUESTIONS[1], cands, edit=QUESTIONS[0])
    assert edited == candidate_tokens(tiny_runtime, QUESTIONS[1], "cold", cands)


@pytest.mark.parametrize("mode", ["cold", "session"])
def test_replay_reports_candidates_and_the_checker(tiny_runtime, mode):
    from headstart.replay_modes import replay_in_mode
    from headstart.typist import Typist

    trace = Typist(wpm=2000, seed=1).trace(QUESTIONS[0])
    seen = []
    result = replay_in_mode(tiny_runtime, "world_1", trace, mode, max_new_tokens=MAX_NEW, wait_typing=False,
                            speed=50.0, candidates=CandidateParams(3, seed=4),
                            checker=lambda request: seen.append(request) or {"checked_ms": 1.0})
    assert result.extra["checked_ms"] == 1.0 and seen[0].candidates is not None
    assert [a["index"] for a in result.extra["candidate_answers"]] == [1, 2]
    assert result.extra["candidates_k"] == 3 and 0 <= result.extra["candidates_ready_at_submit"] <= 3
    cold = candidate_tokens(tiny_runtime, QUESTIONS[0], "cold", CandidateParams(3, seed=4))
    assert [tuple(seen[0].candidates.candidates()[i].token_ids) for i in range(3)] == [cold[i] for i in range(3)]


def test_cancelling_the_request_ends_its_candidates(tiny_runtime):
    params = SamplingParams(max_new_tokens=200)
    request = tiny_runtime.start_complete("world_1", QUESTIONS[2], "cold", params,
                                          candidates=CandidateParams(4, seed=9))
    cset = request.candidates
    while not cset.forked:  # the fork comes with the prefill
        request.done.wait(0.01)
    request.cancel()
    assert cset.wait(60)
    reasons = {c.index: c.finish_reason for c in cset.candidates()}
    assert reasons[0] == "cancelled"
    assert all(len(c.token_ids) < 200 for c in cset.candidates())  # none decoded to its end


def test_closing_the_session_ends_the_pause_candidates(tiny_runtime):
    session = tiny_runtime.open_session("world_1", "headstart", candidates=CandidateParams(3, seed=5))
    session.update(1, QUESTIONS[0])
    session.wait_idle(60, speculation=True)
    pause = session.candidates._set
    assert pause is not None and pause.forked
    tiny_runtime.close_session(session.session_id)
    assert pause._cancelled
    for candidate in pause.sampled:
        assert candidate.job.done.wait(60)


# -- a submit of a smaller cap than the pause's takes the pause's candidates, cut at its cap -----


def cold_answers(runtime, question: str, cands: CandidateParams, max_new: int):
    request = runtime.start_complete("world_1", question, "cold", SamplingParams(max_new_tokens=max_new),
                                     candidates=cands)
    assert request.candidates.wait(120)
    return request.candidates.candidates()


def checked(answers) -> dict:
    from headstart.candidates import Candidate, CandidateRunner, choose
    from headstart.paths import default_spider_dir

    runner = CandidateRunner()
    try:
        world = default_spider_dir() / "database" / "world_1" / "world_1.sqlite"
        return choose(runner.run(world, [Candidate.of(a) for a in answers])).to_dict()
    finally:
        runner.close()


@pytest.mark.parametrize("max_new", [1, MAX_NEW])
def test_a_smaller_submit_cap_cuts_the_pause_candidates_decoded_past_it(tiny_runtime, max_new):
    cands = CandidateParams(4, temperature=1.0, seed=31)
    question = QUESTIONS[2]
    session = tiny_runtime.open_session("world_1", "headstart", candidates=cands)
    try:
        session.update(1, question)
        session.wait_idle(60, speculation=True)
        pause = session.candidates._set
        assert pause is not None and pause.forked and pause.max_new_tokens > max_new
        for c in pause.sampled:  # every pause candidate ran to its end, past the submit's cap
            assert c.job.done.wait(120)
        decoded = [len(c.token_ids) for c in pause.sampled]
        assert min(decoded) > max_new
        request = session.submit(2, question, SamplingParams(max_new_tokens=max_new), candidates=cands)
        assert request.candidates is pause  # handed over, not decoded again
        assert pause.wait(120)
        assert [len(c.token_ids) for c in pause.sampled] == decoded  # no sampled step ran after the submit
        assert pause.num_ahead_tokens == (cands.k - 1) * max_new
        got = pause.candidates()
    finally:
        tiny_runtime.close_session(session.session_id)
    cold = cold_answers(tiny_runtime, question, cands, max_new)
    assert [(a.index, a.token_ids, a.finish_reason, a.text) for a in got] == \
        [(a.index, a.token_ids, a.finish_reason, a.text) for a in cold]
    assert all(a.finish_reason == "length" and len(a.token_ids) == max_new for a in got)
    assert checked(got) == checked(cold)


def test_a_smaller_submit_cap_stops_the_pause_candidates_still_running_at_it(tiny_runtime, monkeypatch):
    from headstart.engine.requests.sampled import SampledCandidate

    cands = CandidateParams(3, temperature=1.0, seed=41)
    question, max_new = QUESTIONS[1], 4
    gate = threading.Event()
    step = SampledCandidate.step

    def held(self):  # the pause's candidates wait at their first step until the submit took them
        gate.wait(60)
        return step(self)

    monkeypatch.setattr(SampledCandidate, "step", held)
    session = tiny_runtime.open_session("world_1", "headstart", candidates=cands)
    try:
        session.update(1, question)
        deadline = time.monotonic() + 60
        while (pause := session.candidates._set) is None or len(pause.sampled) < cands.k - 1:
            assert time.monotonic() < deadline, "the pause's candidates never forked"
            time.sleep(0.01)
        # forked after the greedy answer decoded ahead, from the session's cache: the first
        # step computes the prompt's logits again, so nothing is decoded before it
        assert all(len(c.token_ids) == 0 for c in pause.sampled)
        request = session.submit(2, question, SamplingParams(max_new_tokens=max_new), candidates=cands)
        assert request.candidates is pause
        gate.set()
        assert pause.wait(120)
        got = pause.candidates()
        assert pause.num_ahead_tokens == 0  # held at their first step: none was decoded ahead
    finally:
        gate.set()
        tiny_runtime.close_session(session.session_id)
    monkeypatch.undo()
    cold = cold_answers(tiny_runtime, question, cands, max_new)
    assert [(a.index, a.token_ids, a.finish_reason) for a in got] == \
        [(a.index, a.token_ids, a.finish_reason) for a in cold]
    assert all(len(c.token_ids) == max_new for c in pause.sampled)  # stopped at the cap, not at the pause's
    assert checked(got) == checked(cold)


def test_a_larger_submit_cap_decodes_new_candidates(tiny_runtime):
    cands = CandidateParams(3, temperature=1.0, seed=51)
    ahead = tiny_runtime.limits.answer_ahead_tokens
    _, handed = session_candidates(tiny_runtime, QUESTIONS[0], cands, max_new=ahead + 1)
    assert not handed  # the pause's stopped at its cap: a longer answer is decoded anew
