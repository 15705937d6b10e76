"""Replay a trace in one serving mode: cold, prefix, or an anticipatory session."""

from __future__ import annotations

import time
from typing import Callable

from headstart.engine.requests.candidates import CandidateParams
from headstart.engine.requests.generation import GenerationRequest, SamplingParams, SubmitResult
from headstart.replay import replay_trace, with_candidates
from headstart.trace import Trace

REPLAY_MODES = ("cold", "prefix", "session")


def replay_in_mode(runtime, db: str, trace: Trace, mode: str, policy: str = "headstart",
                   max_new_tokens: int = 64, speed: float = 1.0, wait_typing: bool = True,
                   candidates: CandidateParams | None = None,
                   checker: Callable[[GenerationRequest], dict] | None = None) -> SubmitResult:
    """`cold`/`prefix` do nothing while the user types (the engine is idle),
    so with `wait_typing` they sleep through the trace and compute at Enter.
    `candidates` and `checker`: as `replay.replay_trace`'s (a session's are decoded during its pauses)."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(REPLAY_MODES)}")
    params = SamplingParams(max_new_tokens=max_new_tokens)
    if mode == "session":
        session = runtime.open_session(db, policy, candidates=candidates)
        try:
            return replay_trace(session, trace, params, speed=speed, candidates=candidates, checker=checker)
        finally:
            runtime.close_session(session.session_id)
    runtime.prompt_for(db)  # resolve the schema before the clock starts
    if mode == "prefix":
        runtime.base_state(runtime.prompt_for(db))  # P0 warm, as a prefix cache would hold it
    if wait_typing:
        time.sleep(trace.submit_t / speed)
    request = runtime.start_complete(db, trace.final_text, mode, params, candidates=candidates)
    return with_candidates(request, checker)
