"""Candidates on the trained 0.5B as served (quantized GGUF weights, float32 activations):
the ones a session decodes during the pause, after its greedy answer and bounded by it,
are a cold run's, token for token, and so is the checked choice.

The pause's candidates start from the session's cache cropped back to the prompt (their
first step computes the prompt's logits again), a cold run's from its prefill's logits:
where near-ties are real, this is where a difference in the bits would show.
"""

from __future__ import annotations

import pytest

from headstart.candidates import Candidate, CandidateRunner, choose
from headstart.engine.requests.candidates import CandidateParams
from headstart.engine.requests.generation import SamplingParams
from headstart.kernels import cpu_isa
from headstart.paths import default_spider_dir

pytestmark = pytest.mark.skipif(not cpu_isa.supported(), reason="the quantized kernels need x86-64 with AVX2")

CANDS = CandidateParams(6, temperature=0.7, seed=3)  # the default slack (16): bounded
PARAMS = SamplingParams(max_new_tokens=128)
QUESTIONS = [("world_1", "Which languages are spoken by more than 50 percent of the population of Aruba?"),
             ("car_1", "How many car makers are there in each country? List the country name and the count.")]


@pytest.fixture(scope="module")
def real(trained_runtime):
    return trained_runtime


def described(answers) -> list[tuple]:
    return [(a.index, a.token_ids, a.finish_reason) for a in answers]


def choice_of(db: str, answers) -> tuple:
    runner = CandidateRunner()
    try:
        path = default_spider_dir() / "database" / db / f"{db}.sqlite"
        c = choose(runner.run(path, [Candidate.of(a) for a in answers]))
    finally:
        runner.close()
    return c.index, c.sql, c.rows, c.agreed, c.failed


@pytest.mark.parametrize("db, question", QUESTIONS)
def test_pause_candidates_equal_a_cold_run(real, db, question):
    request = real.start_complete(db, question, "cold", PARAMS, candidates=CANDS)
    assert request.candidates.wait(600)
    cold = request.candidates.candidates()
    session = real.open_session(db, "headstart", candidates=CANDS)
    try:
        for seq, end in enumerate(range(8, len(question), 8), 1):  # typed in chunks, then the whole question
            session.update(seq, question[:end])
        session.update(seq + 1, question)
        session.wait_idle(300, speculation=True)
        pause = session.candidates._set
        assert pause is not None and pause.forked, "the greedy answer decoded ahead ended: its candidates start"
        assert pause.bound() == len(cold[0].token_ids) + CANDS.length_slack  # bounded from the first token
        for c in pause.sampled:
            assert c.job.done.wait(600)
        got = session.submit(seq + 2, question, PARAMS, candidates=CANDS)
        assert got.candidates is pause and pause.wait(600)
        answers = pause.candidates()
    finally:
        real.close_session(session.session_id)
    assert described(answers) == described(cold)
    assert len({a.token_ids for a in cold}) > 1  # sampling made other answers: the comparison means something
    assert choice_of(db, answers) == choice_of(db, cold)
