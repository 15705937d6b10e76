"""Replay a typing trace against a session in real time (or faster)."""

from __future__ import annotations

import time
from typing import Callable

from headstart.engine.requests.candidates import CandidateParams
from headstart.engine.requests.generation import GenerationRequest, SamplingParams, SubmitResult
from headstart.engine.sessions.session import Session
from headstart.trace import Trace
from headstart.typist import Typist


def _sleep_until(start: float, t: float, speed: float) -> None:
    delay = start + t / speed - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def replay_trace(session: Session, trace: Trace, params: SamplingParams = SamplingParams(),
                 speed: float = 1.0, candidates: CandidateParams | None = None,
                 checker: Callable[[GenerationRequest], dict] | None = None) -> SubmitResult:
    """Send each snapshot at its time, then submit; returns the submit's result
    with the session's compute accounting in `extra` (with `candidates`, every
    candidate's answer in `extra["candidate_answers"]` once all ended).
    `checker(request)` (benchmarks: the checked answer's time) adds its fields to `extra`."""
    if speed <= 0:
        raise ValueError("speed must be > 0")
    start = time.perf_counter()
    seq = 0
    for event in trace.events:
        _sleep_until(start, event.t, speed)
        seq += 1
        session.update(seq, event.text)
    _sleep_until(start, trace.submit_t, speed)
    request = session.submit(seq + 1, trace.final_text, params, candidates=candidates)
    result = with_candidates(request, checker)
    stats = session.stats()
    result.extra.update(computed_tokens_total=stats.computed_tokens, memory_bytes=stats.memory_bytes)
    return result


def with_candidates(request: GenerationRequest, checker: Callable[[GenerationRequest], dict] | None = None,
                    ) -> SubmitResult:
    """`request`'s result; `checker`'s fields, then (for a candidate set) every candidate's answer in `extra`
    and how many candidates (the greedy one included) were finished when it was called, at Enter."""
    ready = request.candidates.num_finished() if request.candidates is not None else None
    result = request.result()
    if checker is not None:
        result.extra.update(checker(request))
    if request.candidates is not None:
        request.candidates.wait()
        result.extra["candidates_done_ms"] = (time.perf_counter() - request.started) * 1000.0
        result.extra["candidates_ready_at_submit"] = ready  # of params.k
        result.extra["candidates_k"] = request.candidates.params.k
        result.extra["candidate_answers"] = [
            {"index": c.index, "text": c.text, "finish_reason": c.finish_reason, "num_tokens": len(c.token_ids)}
            for c in request.candidates.candidates() if c.index > 0]
    return result


def replay_typed(runtime, db: str, question: str, policy: str = "headstart", wpm: float = 40.0,
                 typo_rate: float = 0.0, pause_s: float = 0.0, seed: int = 0, speed: float = 1.0,
                 max_new_tokens: int = 128, candidates: CandidateParams | None = None) -> SubmitResult:
    """Type `question` as a synthetic typist into a fresh session of `runtime`
    (an `EngineRuntime`), then submit (with `candidates`: see `replay_trace`)."""
    trace = Typist(wpm=wpm, typo_rate=typo_rate, pause_s=pause_s, seed=seed).trace(question)
    session = runtime.open_session(db, policy, candidates=candidates)
    try:
        return replay_trace(session, trace, SamplingParams(max_new_tokens=max_new_tokens), speed=speed,
                            candidates=candidates)
    finally:
        runtime.close_session(session.session_id)
