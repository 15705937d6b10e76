"""bench/serve_sim.py: the scheduler's rules replayed on `bench serve`'s workload in virtual time."""

from __future__ import annotations

import pytest

from bench.serve_sim import RULES, Sim, Typist, forward_ms
from headstart.engine.sched.scheduler import Scheduler
from headstart.typist import Typist as TraceTypist

QUESTIONS = ["How many countries are in Europe?", "What is the population of the largest city in Asia?",
             "List the official languages of Aruba.", "Which continent has the most countries?"]


def typists(n: int) -> list[Typist]:
    tracer = TraceTypist(wpm=60.0, pause_s=0.3, seed=0)
    out = []
    for i in range(n):
        trace = tracer.trace(QUESTIONS[i % len(QUESTIONS)])
        out.append(Typist(f"u{i}", [(e.t, e.text) for e in trace.events], trace.submit_t, QUESTIONS[i % len(QUESTIONS)]))
    return out


@pytest.mark.parametrize("rules", list(RULES))
@pytest.mark.parametrize("anticipate", [True, False])
def test_every_answer_streams_all_its_tokens_in_order(rules, anticipate):
    answers = Sim(Scheduler(max_batch_rows=8, max_batch_tokens=64, **RULES[rules]), typists(4), anticipate, 32).run()
    assert len(answers) == 4
    for a in answers:
        assert a.left == 0 and a.submit_t <= a.first_t <= a.last_t
        # 31 decode steps after the first token, each at least one forward
        assert a.last_t - a.first_t >= 31 * forward_ms(1, 1) / 1000


def test_prefix_mode_prefills_the_whole_question_at_submit():
    (a,) = Sim(Scheduler(), typists(1), False, 4).run()
    assert a.first_t - a.submit_t > forward_ms(1, 1) / 1000  # a multi-token prefill, not a decode step
