"""The product's promise: anticipatory sessions generate exactly the tokens
of a cold prefill of the final prompt, for every policy, every kind of edit
and every typing speed (float64, random:tiny)."""

from __future__ import annotations

import random

import pytest

from headstart.engine.requests.generation import SamplingParams
from tests.typing_traces import KINDS, QUESTIONS
from tests.worker_gates import hold_worker, queue_gate

MAX_NEW = 12
PARAMS = SamplingParams(max_new_tokens=MAX_NEW)


def replay(runtime, policy: str, snapshots: list[str], pace: str, rng: random.Random):
    """Send snapshots; `pace` decides when the worker gets to catch up:
    fast = never waits (the worker sees only some snapshots), slow = waits
    after each, mixed = waits at random points."""
    session = runtime.open_session("world_1", policy)
    try:
        for seq, text in enumerate(snapshots, 1):
            session.update(seq, text)
            if pace == "slow" or (pace == "mixed" and rng.random() < 0.3):
                session.wait_idle()
        return session.submit(len(snapshots) + 1, snapshots[-1], PARAMS).result()
    finally:
        runtime.close_session(session.session_id)


@pytest.fixture(scope="module")
def cold(tiny_runtime):
    memo = {}

    def run(text: str) -> list[int]:
        if text not in memo:
            memo[text] = tiny_runtime.complete("world_1", text, "cold", MAX_NEW).token_ids
        return memo[text]

    return run


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("policy", ["headstart", "paper"])
@pytest.mark.parametrize("pace", ["fast", "slow", "mixed"])
def test_session_matches_cold(tiny_runtime, cold, kind, policy, pace):
    rng = random.Random(f"{kind}-{policy}-{pace}")
    question = QUESTIONS[rng.randrange(len(QUESTIONS))]
    snapshots = KINDS[kind](question, rng)
    result = replay(tiny_runtime, policy, snapshots, pace, rng)
    expected = cold(snapshots[-1])
    assert len(expected) == MAX_NEW  # random weights: no early stop, the whole run is compared
    assert result.token_ids == expected


@pytest.mark.parametrize("mode", ["cold", "prefix"])
def test_stateless_modes_match_cold(tiny_runtime, cold, mode):
    for question in QUESTIONS:
        assert tiny_runtime.complete("world_1", question, mode, MAX_NEW).token_ids == cold(question)


def test_random_model_is_context_sensitive(cold):
    """Guards the guard: if a random model ignored its prompt, the exactness
    tests above could not fail."""
    outputs = {tuple(cold(q)) for q in QUESTIONS}
    assert len(outputs) == len(QUESTIONS)


def test_caught_up_submit_needs_no_forward(tiny_runtime):
    question = QUESTIONS[0]
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        for seq, text in enumerate([question[:10], question], 1):
            session.update(seq, text)
        session.wait_idle()
        result = session.submit(3, question, PARAMS).result()
    finally:
        tiny_runtime.close_session(session.session_id)
    assert result.computed_tokens_at_submit == 0
    assert result.cached_tokens_at_submit == result.prompt_tokens


def test_paper_policy_leaves_the_turn_end_to_submit(tiny_runtime):
    question = "How many cities are there ?"  # ends on a boundary pair: committed at once
    session = tiny_runtime.open_session("world_1", "paper")
    try:
        session.update(1, question + " ")
        session.wait_idle()
        result = session.submit(2, question + " ", PARAMS).result()
    finally:
        tiny_runtime.close_session(session.session_id)
    # the paper commits typed words only: the end of the user turn and the
    # assistant turn are computed at submit (they also yield the logits, so the
    # paper's separate backstep is merged into this flush)
    suffix = len(tiny_runtime.prompt_for("world_1").parts.tail_special)
    assert result.computed_tokens_at_submit == suffix
    assert result.cached_tokens_at_submit == result.prompt_tokens - suffix


def test_backstep_when_cache_holds_prompt_without_logits(tiny_runtime, cold):
    """A cache that covers the whole prompt but kept no logits recomputes the
    last token (the paper's backstep) and still matches a cold run."""
    prompt = tiny_runtime.prompt_for("world_1")
    ids = prompt.prompt_ids(QUESTIONS[1])
    state = tiny_runtime.worker.run_sync(lambda: tiny_runtime.runner.prefill(ids))
    state.last_logits = None
    from headstart.engine.requests.generation import GenerationRequest

    request = GenerationRequest(tiny_runtime.runner, prompt.decode, ids, PARAMS, tiny_runtime.stop_ids, 64, state=state)
    tiny_runtime.worker.enqueue(request, 1)
    result = request.result()
    assert result.computed_tokens_at_submit == 1
    assert result.token_ids == cold(QUESTIONS[1])


@pytest.mark.parametrize(("ahead_budget", "max_new"), [(32, 12), (5, 12), (1, 12), (0, 12)])
def test_answer_ahead_streams_known_tokens(tiny_runtime, cold, monkeypatch, ahead_budget, max_new):
    """After a pause the greedy answer is decoded ahead; submit streams it
    without a forward pass and goes on decoding: still exactly cold."""
    from dataclasses import replace

    monkeypatch.setattr(tiny_runtime, "limits", replace(tiny_runtime.limits, answer_ahead_tokens=ahead_budget))
    question = QUESTIONS[2]
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        session.update(1, question)
        session.wait_idle(speculation=True)
        result = session.submit(2, question, SamplingParams(max_new_tokens=max_new)).result()
    finally:
        tiny_runtime.close_session(session.session_id)
    assert result.token_ids == cold(question)
    assert result.extra["answer_tokens_ready_at_submit"] == min(ahead_budget, max_new)
    assert result.computed_tokens_at_submit == 0


def test_edit_after_answer_ahead_crops_it(tiny_runtime, cold):
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        session.update(1, QUESTIONS[0])
        session.wait_idle(speculation=True)
        session.update(2, QUESTIONS[0][:-5] + "town?")
        result = session.submit(3, QUESTIONS[0][:-5] + "town?", PARAMS).result()
    finally:
        tiny_runtime.close_session(session.session_id)
    assert result.token_ids == cold(QUESTIONS[0][:-5] + "town?")
    assert result.wasted_tokens >= 31  # the speculative answer was cropped


def test_sampling_with_answer_ahead_matches_cold_sampling(tiny_runtime):
    params = SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.9, seed=7)
    question = QUESTIONS[3]
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        session.update(1, question)
        session.wait_idle(speculation=True)
        result = session.submit(2, question, params).result()
    finally:
        tiny_runtime.close_session(session.session_id)
    reference = tiny_runtime.start_complete("world_1", question, "cold", params).result()
    assert result.token_ids == reference.token_ids
    assert result.extra["answer_tokens_ready_at_submit"] == 0  # greedy-only shortcut


def submit_while_held(session, question: str, gate, cold):
    """Submit while the worker is held: the first token must stream from the
    caller's thread at once; then release the worker and return the result."""
    request = session.submit(2, question, PARAMS)
    assert request.first_token_at is not None
    assert next(request.stream()) == cold(question)[0]
    gate.set()
    return request.result()


def test_known_answer_streams_before_the_step_in_flight(tiny_runtime, cold):
    """A submit while an answer-ahead step is still running emits the tokens
    already known from the caller's thread; the rest follows from the worker."""
    import threading

    question = QUESTIONS[1]
    session = tiny_runtime.open_session("world_1", "headstart")
    gate = threading.Event()
    try:
        session.update(1, question)
        session.wait_idle(speculation=True)
        hold_worker(tiny_runtime.worker, gate=gate)  # so the submit cannot run there
        result = submit_while_held(session, question, gate, cold)
    finally:
        gate.set()
        tiny_runtime.close_session(session.session_id)
    assert result.token_ids == cold(question)


def test_known_answer_can_finish_without_the_worker(tiny_runtime, cold):
    question = QUESTIONS[2]
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        session.update(1, question)
        session.wait_idle(speculation=True)
        result = session.submit(2, question, SamplingParams(max_new_tokens=3)).result()
    finally:
        tiny_runtime.close_session(session.session_id)
    assert result.token_ids == cold(question)[:3] and result.finish_reason == "length"


@pytest.mark.parametrize(("policy", "scope", "stream_tokens"), [
    ("headstart", "typing", 8), ("headstart", "typing,decode", 8), ("headstart", "typing+decode", 8),
    # typing rows beside streaming answers cut to one token per forward (the scheduler's rule 2c)
    ("headstart", "typing+decode", 1),
    ("headstart", "all", 8), ("paper", "all", 8)])
def test_sessions_sharing_batched_forwards_match_cold(tiny_runtime, cold, policy, scope, stream_tokens, monkeypatch):
    """Several sessions type at once (every kind of edit) next to stateless
    requests, so the worker batches their forward passes (typing rows; with
    scope "all" also submit prefills, decode steps and answer-ahead in one
    padded forward): every output still equals its cold run. (The paper
    policy extends only on word boundaries, too rarely at once for typing
    rows alone to be sure to meet.)"""
    import threading
    import time

    worker = tiny_runtime.worker
    monkeypatch.setattr(worker, "max_batch_rows", 8)
    monkeypatch.setattr(worker, "batch_scope", scope)
    monkeypatch.setattr(worker.scheduler, "stream_tokens", stream_tokens)
    before = (worker.batched_forwards, worker.batched_rows)
    kinds = sorted(KINDS)
    results, errors = {}, []
    # hold the worker while every typist sends its first snapshots, so the first groups are full
    gate = hold_worker(worker)
    # Typing rows alone meet only while no submit is pending: with that scope
    # every typist sends its snapshots, the worker is let go, and they submit
    # once their typing is done.
    typed = threading.Barrier(7) if scope != "all" else None

    def typist(i: int) -> None:
        rng = random.Random(f"batch-{policy}-{i}")
        snapshots = KINDS[kinds[i % len(kinds)]](QUESTIONS[i % len(QUESTIONS)], rng)
        session = tiny_runtime.open_session("world_1", policy)
        try:
            for seq, text in enumerate(snapshots, 1):
                session.update(seq, text)
                if rng.random() < 0.2:
                    time.sleep(rng.random() * 0.01)
            if typed is not None:
                typed.wait(30)
                session.wait_idle(60)
            results[i] = (snapshots[-1], session.submit(len(snapshots) + 1, snapshots[-1], PARAMS).result().token_ids)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            tiny_runtime.close_session(session.session_id)

    def stateless(i: int) -> None:
        question = QUESTIONS[i % len(QUESTIONS)]
        results[f"prefix-{i}"] = (question, tiny_runtime.complete("world_1", question, "prefix", MAX_NEW).token_ids)

    threads = [threading.Thread(target=typist, args=(i,)) for i in range(6)]
    threads += [threading.Thread(target=stateless, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    if typed is not None:
        typed.wait(30)
    else:
        time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(120)
    assert not errors
    assert len(results) == 8
    for text, tokens in results.values():
        assert tokens == cold(text)
    forwards, rows = worker.batched_forwards - before[0], worker.batched_rows - before[1]
    assert forwards > 0 and rows > forwards, "the workload must have shared forward passes"


def test_answer_ahead_of_a_finished_question_rides_with_streaming_answers(tiny_runtime, cold, monkeypatch):
    """While another answer streams, a session whose question reads as
    finished ("?") decodes its own answer ahead in that answer's forwards
    (an IDLE step alone would wait until the worker has nothing else to do),
    and its submit is still exactly cold."""
    import time

    worker = tiny_runtime.worker
    monkeypatch.setattr(worker, "max_batch_rows", 8)
    monkeypatch.setattr(worker, "batch_scope", "typing+decode")
    question = QUESTIONS[2]
    assert question.endswith("?")
    streaming = tiny_runtime.start_complete("world_1", QUESTIONS[0], "prefix", SamplingParams(max_new_tokens=600))
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        assert next(streaming.stream()) is not None  # the other answer streams
        session.update(1, question)
        deadline = time.monotonic() + 60
        while len(session.ahead.tokens) < 4 and not streaming.done.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not streaming.done.is_set(), "answer-ahead did not run while the other answer streamed"
        assert len(session.ahead.tokens) >= 4
        result = session.submit(2, question, PARAMS).result()
    finally:
        streaming.cancel()
        tiny_runtime.close_session(session.session_id)
    assert result.token_ids == cold(question)
    assert result.extra["answer_tokens_ready_at_submit"] >= 4


def test_first_answer_token_is_ready_when_typing_catches_up(tiny_runtime, cold):
    """The typing step that brings the cache to the whole prompt also picks
    the first answer token (no forward needed), so a submit right after it
    streams that token at once even while the worker is busy elsewhere."""
    import threading

    question = QUESTIONS[3]
    session = tiny_runtime.open_session("world_1", "headstart")
    gate, held = threading.Event(), threading.Event()

    def hold_worker_next(seq, cached, total):  # inside the typing step, before it returns
        if cached == total and not held.is_set():
            queue_gate(tiny_runtime.worker, gate, held)

    session.on_progress = hold_worker_next
    try:
        session.update(1, question)
        assert held.wait(10)  # the worker is held: no answer-ahead step can run
        result = submit_while_held(session, question, gate, cold)
    finally:
        gate.set()
        tiny_runtime.close_session(session.session_id)
    assert result.token_ids == cold(question)
    assert result.computed_tokens_at_submit == 0
