"""The session and request state machines: the transition tables themselves,
and the states a real session and request go through (tiny model)."""

from __future__ import annotations

import itertools
import threading

import pytest

from headstart.engine.requests import generation as generation_module
from headstart.engine.sessions import session as session_module
from headstart.engine.errors import Cancelled, SessionClosed
from headstart.engine.requests.generation import SamplingParams
from headstart.engine.states import (
    FINAL_REQUEST_STATES, REQUEST_TRANSITIONS, SESSION_TRANSITIONS, IllegalTransition, RequestState,
    SessionState, advance,
)
from headstart.engine.sched.jobs import Priority
from tests.worker_gates import hold_worker

S, R = SessionState, RequestState


@pytest.mark.parametrize(("enum", "table"), [(SessionState, SESSION_TRANSITIONS), (RequestState, REQUEST_TRANSITIONS)])
def test_every_pair_is_allowed_exactly_when_the_table_lists_it(enum, table):
    assert set(table) == set(enum)
    for current, new in itertools.product(enum, enum):
        if new is current or new in table[current]:
            assert advance(current, new) is new
        else:
            with pytest.raises(IllegalTransition):
                advance(current, new)


# (state, some states it must reach, some it must never reach directly)
SESSION_CASES = [
    (S.IDLE, {S.TYPING_DIRTY, S.GENERATING, S.CLOSED}, {S.PREFILLING, S.READY, S.ANSWERING_AHEAD}),
    (S.TYPING_DIRTY, {S.PREFILLING, S.GENERATING}, {S.READY, S.ANSWERING_AHEAD}),
    (S.PREFILLING, {S.TYPING_DIRTY, S.READY, S.ANSWERING_AHEAD, S.GENERATING}, set()),
    (S.READY, {S.TYPING_DIRTY, S.GENERATING}, {S.PREFILLING, S.ANSWERING_AHEAD, S.IDLE}),
    (S.ANSWERING_AHEAD, {S.TYPING_DIRTY, S.READY, S.GENERATING}, {S.PREFILLING, S.IDLE}),
    (S.GENERATING, {S.IDLE, S.TYPING_DIRTY}, {S.PREFILLING, S.READY, S.ANSWERING_AHEAD}),
    (S.CLOSED, set(), set(SessionState) - {S.CLOSED}),
]


@pytest.mark.parametrize(("state", "reaches", "never"), SESSION_CASES, ids=[c[0].name for c in SESSION_CASES])
def test_session_transitions(state, reaches, never):
    assert reaches <= SESSION_TRANSITIONS[state]
    assert not never & SESSION_TRANSITIONS[state]
    if state is not S.CLOSED:
        assert S.CLOSED in SESSION_TRANSITIONS[state]  # close() works from anywhere


def test_request_transitions_run_forward_and_end_once():
    order = [R.QUEUED, R.PREFILL, R.DECODE]
    for i, state in enumerate(order):
        assert not set(order[:i]) & REQUEST_TRANSITIONS[state]  # never back
        assert FINAL_REQUEST_STATES - {R.DONE} <= REQUEST_TRANSITIONS[state]  # cancel/fail from anywhere
    assert R.DONE in REQUEST_TRANSITIONS[R.QUEUED]  # known answer tokens end it without a step
    for final in FINAL_REQUEST_STATES:
        assert REQUEST_TRANSITIONS[final] == frozenset()


def test_advance_rejects_a_state_of_the_other_machine():
    with pytest.raises(IllegalTransition):
        advance(S.IDLE, R.QUEUED)


def _recording(monkeypatch, module) -> list:
    seen: list = []
    real = module.advance

    def advance_and_record(current, new):
        result = real(current, new)
        if new is not current:
            seen.append(new)
        return result

    monkeypatch.setattr(module, "advance", advance_and_record)
    return seen


def test_a_session_walks_its_states(tiny_runtime, monkeypatch):
    """Typing, catching up, answer-ahead, a submit and its end, close: the
    states a session goes through, in order, all through the table."""
    seen = _recording(monkeypatch, session_module)
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        assert session.status is S.IDLE and session.is_idle()
        session.update(1, "How many countries?")
        session.wait_idle(30, speculation=True)
        assert session.status is S.READY and session.is_idle()
        assert seen[:2] == [S.TYPING_DIRTY, S.PREFILLING]
        assert S.ANSWERING_AHEAD in seen and seen[-1] is S.READY
        seen.clear()
        result = session.submit(2, "How many countries?", SamplingParams(max_new_tokens=2)).result(30)
        assert result.token_ids and session.status is S.IDLE
        assert seen == [S.GENERATING, S.IDLE]
    finally:
        tiny_runtime.close_session(session.session_id)
    assert session.status is S.CLOSED and session.closed
    with pytest.raises(SessionClosed):
        session.update(3, "more")


def test_a_snapshot_during_a_step_makes_it_run_again(tiny_runtime, monkeypatch):
    """A snapshot while the typing step waits keeps TYPING_DIRTY; one that
    arrives while a step runs (here: from its progress report, on the
    worker) moves PREFILLING -> TYPING_DIRTY, and the step runs again with
    the newest text until the cache holds it."""
    seen = _recording(monkeypatch, session_module)
    worker = tiny_runtime.worker
    session = tiny_runtime.open_session("world_1", "headstart")
    session.on_progress = lambda seq, *_: seq == 2 and session.update(3, "How many cities are there?")
    try:
        gate = hold_worker(worker)
        session.update(1, "How many")
        assert session.status is S.TYPING_DIRTY and not session.is_idle()
        session.update(2, "How many cities?")
        assert session.status is S.TYPING_DIRTY
        gate.set()
        session.wait_idle(30, speculation=True)
        assert session.status is S.READY
        assert seen[:4] == [S.TYPING_DIRTY, S.PREFILLING, S.TYPING_DIRTY, S.PREFILLING]
        seq, cached, total = session.progress()
        assert (seq, cached) == (3, total)
    finally:
        tiny_runtime.close_session(session.session_id)


def test_a_request_walks_its_states(tiny_runtime, monkeypatch):
    seen = _recording(monkeypatch, generation_module)
    request = tiny_runtime.start_complete("world_1", "How many countries?", "prefix", SamplingParams(max_new_tokens=3))
    request.result(30)
    assert request.status is R.DONE
    assert seen[0] is R.PREFILL and seen[-2:] == [R.DECODE, R.DONE] and set(seen) == {R.PREFILL, R.DECODE, R.DONE}


def test_a_cancelled_request_ends_cancelled(tiny_runtime):
    worker = tiny_runtime.worker
    gate = hold_worker(worker)
    request = tiny_runtime.start_complete("world_1", "How many countries?", "prefix", SamplingParams(max_new_tokens=3))
    assert request.status is R.QUEUED
    request.cancel()
    gate.set()
    with pytest.raises(Cancelled):
        request.result(30)
    assert request.status is R.CANCELLED and request.finish_reason == "cancelled"


def test_a_failing_step_ends_the_request_failed(tiny_runtime):
    done = threading.Event()
    request = generation_module.GenerationRequest(
        tiny_runtime.runner, str, [1, 2, 3], SamplingParams(max_new_tokens=2), set(), 8,
        prepare=lambda: (_ for _ in ()).throw(ValueError("no cache")), on_finish=lambda _r: done.set())
    request.enqueue_on(tiny_runtime.worker, Priority.POOL, "failing")
    with pytest.raises(ValueError):
        request.result(30)
    assert done.is_set() and request.status is R.FAILED


def test_an_illegal_move_raises_in_a_real_session(tiny_runtime):
    """A step that would move a closed session anywhere raises: the table is enforced, not advisory."""
    session = tiny_runtime.open_session("world_1", "headstart")
    tiny_runtime.close_session(session.session_id)
    with pytest.raises(IllegalTransition):
        session._set(S.TYPING_DIRTY)
