"""The greedy-length bound on sampled candidates, and the pause decoding the greedy answer first.

A float64 `random:tiny` runtime of this module's own, whose stop ids also
hold the fifth token of the greedy answer to QUESTION: the greedy answer
stops after 4 tokens there, so the bound (4 + slack) is known, while the
random weights' sampled candidates run on far past it. float64: the same
logits give the same samples, so "the same candidates" cannot pass by luck.
"""

from __future__ import annotations

import pytest

from headstart.engine.requests.candidates import CandidateParams
from headstart.engine.requests.generation import SamplingParams
from headstart.engine.runtime import EngineRuntime
from tests.typing_traces import QUESTIONS

QUESTION = QUESTIONS[2]
GREEDY_LEN = 4
SLACK = 3
MAX_NEW = 24


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    rt = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_dir=tmp_path_factory.mktemp("p0"),
                                     chunk_tokens=64, debounce_ms=0.0)
    try:
        greedy = rt.complete("world_1", QUESTION, "cold", MAX_NEW).token_ids
        stop = greedy[GREEDY_LEN]
        assert stop not in greedy[:GREEDY_LEN], "pick another position: the greedy answer must stop there"
        rt.stop_ids = set(rt.stop_ids) | {stop}  # read by each request and session opened after
        yield rt
    finally:
        rt.shutdown()


def cold(rt, cands: CandidateParams):
    request = rt.start_complete("world_1", QUESTION, "cold", SamplingParams(max_new_tokens=MAX_NEW), candidates=cands)
    assert request.candidates.wait(120)
    return request.candidates.candidates()


def described(answers) -> list[tuple]:
    return [(a.index, a.token_ids, a.finish_reason, a.text) for a in answers]


def test_sampled_candidates_are_bounded_at_the_greedy_length_plus_the_slack(runtime):
    got = cold(runtime, CandidateParams(4, temperature=1.0, seed=7, length_slack=SLACK))
    assert got[0].finish_reason == "stop" and len(got[0].token_ids) == GREEDY_LEN
    sampled = got[1:]
    assert all(len(a.token_ids) <= GREEDY_LEN + SLACK for a in sampled)
    bounded = [a for a in sampled if a.finish_reason == "bounded"]
    assert bounded, "random weights: some sampled candidate runs past the bound"
    assert all(len(a.token_ids) == GREEDY_LEN + SLACK for a in bounded)
    # without a bound the same candidates run on: the bound cut them, it did not change them
    free = cold(runtime, CandidateParams(4, temperature=1.0, seed=7, length_slack=None))
    assert free[0].token_ids == got[0].token_ids
    for cut, whole in zip(sampled, free[1:]):
        assert whole.token_ids[:len(cut.token_ids)] == cut.token_ids
        assert (len(whole.token_ids) > GREEDY_LEN + SLACK) == (cut.finish_reason == "bounded")


def test_the_pause_decodes_the_greedy_answer_first_and_its_candidates_match_a_cold_run(runtime, monkeypatch):
    from headstart.engine.requests.sampled import SampledCandidate

    cands = CandidateParams(4, temperature=1.0, seed=7, length_slack=SLACK)
    expected = cold(runtime, cands)
    session = runtime.open_session("world_1", "headstart", candidates=cands)
    greedy_done_at_step: list[bool] = []
    step = SampledCandidate.step

    def watched(self):  # every sampled step of the pause: had the greedy answer decoded ahead ended?
        tokens = session.ahead.tokens
        greedy_done_at_step.append(bool(tokens) and tokens[-1] in runtime.stop_ids)
        return step(self)

    monkeypatch.setattr(SampledCandidate, "step", watched)
    try:
        session.update(1, QUESTION)
        session.wait_idle(60, speculation=True)
        pause = session.candidates._set
        assert pause is not None and pause.forked
        assert pause.bound() == GREEDY_LEN + SLACK  # known from the answer decoded ahead, before any submit
        for c in pause.sampled:
            assert c.job.done.wait(120)
        assert greedy_done_at_step and all(greedy_done_at_step)  # none ran beside the greedy answer
        request = session.submit(2, QUESTION, SamplingParams(max_new_tokens=MAX_NEW), candidates=cands)
        assert request.candidates is pause and pause.wait(120)
        got = pause.candidates()
    finally:
        runtime.close_session(session.session_id)
    assert described(got) == described(expected)


def test_a_bounded_candidate_is_not_run(runtime):
    from headstart.candidates import Candidate, CandidateRunner, choose
    from headstart.paths import default_spider_dir

    answers = cold(runtime, CandidateParams(4, temperature=1.0, seed=7, length_slack=SLACK))
    runner = CandidateRunner()
    try:
        world = default_spider_dir() / "database" / "world_1" / "world_1.sqlite"
        choice = choose(runner.run(world, [Candidate.of(a) for a in answers]))
    finally:
        runner.close()
    by_index = {o.index: o for o in choice.outcomes}
    for a in answers:
        if a.finish_reason == "bounded":
            assert by_index[a.index].error_code == "bounded" and a.index in choice.failed


def test_a_greedy_answer_that_does_not_stop_bounds_nothing(tiny_runtime):
    # the shared runtime's greedy answer to QUESTION runs to its cap: no candidate is bounded
    request = tiny_runtime.start_complete("world_1", QUESTION, "cold", SamplingParams(max_new_tokens=8),
                                          candidates=CandidateParams(3, temperature=1.0, seed=7, length_slack=0))
    assert request.candidates.wait(120)
    got = request.candidates.candidates()
    assert got[0].finish_reason == "length" and request.candidates.bound() is None
    assert all(a.finish_reason != "bounded" for a in got)
