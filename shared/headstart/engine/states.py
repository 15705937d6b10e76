"""The states of a typing session and of a generation request, with every
allowed transition written once, here.

A session or a request holds one state (an enum below) instead of flags;
`advance(current, new)` is the only way to change it and raises
`IllegalTransition` for a move its table does not list (a bug, never a
client error). Staying in the same state is always allowed (a no-op), so
callers need not test before re-asserting where they are.

Session (`headstart.engine.sessions.session.Session`):

    IDLE             nothing queued: no text yet, the policy leaves the cache as
                     it is for now (a debounce recheck may be pending), or a
                     generation just ended
    TYPING_DIRTY     a typing step is queued and a snapshot newer than what the
                     cache is heading for waits to be read
    PREFILLING       a typing step is queued or running with the newest snapshot
    READY            caught up: the cache holds what the policy wants (the whole
                     prompt with its logits under `headstart`), nothing queued
    ANSWERING_AHEAD  an IDLE-priority answer-ahead step is queued or running
    GENERATING       a submit's request owns the cache (a typing step already in
                     flight may still finish: its work is what the submit needs)
    CLOSED           final

Request (`headstart.engine.requests.generation.GenerationRequest`):

    QUEUED -> PREFILL -> DECODE -> DONE, and CANCELLED / FAILED from any
    non-final state. A request whose answer tokens are all known at submit
    (answer-ahead) goes QUEUED -> DONE without a step; one whose first tokens
    are known skips PREFILL's forward but still passes through it.
"""

from __future__ import annotations

from enum import Enum


class IllegalTransition(RuntimeError):
    """A state change the transition table does not allow (an engine bug)."""


class SessionState(Enum):
    IDLE = "idle"
    TYPING_DIRTY = "typing_dirty"
    PREFILLING = "prefilling"
    READY = "ready"
    ANSWERING_AHEAD = "answering_ahead"
    GENERATING = "generating"
    CLOSED = "closed"


class RequestState(Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


S, R = SessionState, RequestState

SESSION_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    # a new snapshot queues a typing step; a submit takes the cache
    S.IDLE: frozenset({S.TYPING_DIRTY, S.GENERATING, S.CLOSED}),
    # the typing step reads the snapshot (IDLE: it failed)
    S.TYPING_DIRTY: frozenset({S.PREFILLING, S.IDLE, S.GENERATING, S.CLOSED}),
    # more chunks (stays), a newer snapshot, caught up, nothing to do, answer-ahead
    S.PREFILLING: frozenset({S.TYPING_DIRTY, S.READY, S.IDLE, S.ANSWERING_AHEAD, S.GENERATING, S.CLOSED}),
    S.READY: frozenset({S.TYPING_DIRTY, S.GENERATING, S.CLOSED}),
    # an edit makes the speculative answer moot; a submit uses it; it ends
    S.ANSWERING_AHEAD: frozenset({S.TYPING_DIRTY, S.READY, S.GENERATING, S.CLOSED}),
    # when the request ends: a snapshot sent meanwhile queues typing, else idle
    S.GENERATING: frozenset({S.TYPING_DIRTY, S.IDLE, S.CLOSED}),
    S.CLOSED: frozenset(),
}

REQUEST_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    R.QUEUED: frozenset({R.PREFILL, R.DONE, R.CANCELLED, R.FAILED}),
    R.PREFILL: frozenset({R.DECODE, R.DONE, R.CANCELLED, R.FAILED}),
    R.DECODE: frozenset({R.DONE, R.CANCELLED, R.FAILED}),
    R.DONE: frozenset(),
    R.CANCELLED: frozenset(),
    R.FAILED: frozenset(),
}

FINAL_REQUEST_STATES = frozenset({R.DONE, R.CANCELLED, R.FAILED})


def advance(current: Enum, new: Enum) -> Enum:
    """`new` if the table of `current`'s enum allows the move, else raise
    `IllegalTransition`. Staying put is allowed."""
    if new is current:
        return new
    table = SESSION_TRANSITIONS if isinstance(current, SessionState) else REQUEST_TRANSITIONS
    if type(new) is not type(current) or new not in table[current]:
        raise IllegalTransition(f"{type(current).__name__}: {current.name} -> {new.name} is not allowed")
    return new
