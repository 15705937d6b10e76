"""A closed session gives its KV blocks back when it closes, also while its
answer-ahead job waits behind a busy worker (issue 45): the blocks must not
wait for the worker to reach and drop the job. Deterministic: the worker is
held by a gate job that blocks only once the session is answering ahead, so
the answer-ahead job is queued, never running, when the session closes."""

from __future__ import annotations

import threading

from headstart.engine.errors import Cancelled
from headstart.engine.sched.jobs import Priority
from headstart.engine.states import SessionState

QUESTION = "How many cities are there in each country?"


def _blocks_used(runtime) -> int:
    return runtime.sessions.kv_usage().blocks_used


def _hold_once_answering_ahead(runtime, session) -> tuple[threading.Event, threading.Event]:
    """A gate at IDLE (behind the typing job): it blocks the worker once the session answers ahead,
    and asks to run again until then. Returns (gate: set to release, held: set once blocking)."""
    gate, held = threading.Event(), threading.Event()

    def step() -> bool:
        if session.status is not SessionState.ANSWERING_AHEAD:
            return not gate.is_set()  # not yet: again after the typing steps
        held.set()
        gate.wait(30)
        return False

    runtime.worker.enqueue(step, Priority.IDLE, "gate")
    return gate, held


def test_closing_a_session_with_answer_ahead_queued_frees_its_blocks_at_once(tiny_runtime):
    runtime = tiny_runtime
    warm = runtime.open_session("world_1")  # the database's P0 is stored: what stays after the close
    warm.close()
    runtime.worker.run_sync(lambda: None)  # the worker has dropped whatever the warm-up left queued
    before = _blocks_used(runtime)
    session = runtime.open_session("world_1")
    gate, held = _hold_once_answering_ahead(runtime, session)
    try:
        session.update(1, QUESTION)
        assert held.wait(30), f"the session never answered ahead (status {session.status})"
        job = session._job
        assert job is not None and job.name.startswith("ahead:") and not job.done.is_set()
        assert runtime.worker.num_queued >= 1  # the answer-ahead job waits behind the gate
        holding = _blocks_used(runtime)
        assert holding > before, (holding, before)  # the question and answer-ahead tokens are in blocks
        runtime.close_session(session.session_id)
        # the worker is still held: the blocks came back at the close, not when the job drained
        assert _blocks_used(runtime) == before, (_blocks_used(runtime), before, holding)
        assert job.done.is_set() and isinstance(job.error, Cancelled)
        assert session.kv_state.num_tokens == 0
    finally:
        gate.set()
    runtime.worker.run_sync(lambda: None)  # the worker goes on with nothing of the session left
    assert _blocks_used(runtime) == before
