"""The states of a data session, each move written once (like `engine/states.py`).

Session lifecycle (`DataState`):

    OPENING   the frozen region (instructions + schema) is being brought from P0
    LIVE      pushes, ingestion and queries are served
    FAILED    ingestion failed (a batch's forward or insert raised): the session
              takes nothing more, every call says so (SESSION_FAILED with the
              reason) and `describe` names it; never a silent stop (issue 29)
    CLOSED    final

Retention (`RetentionState`), orthogonal to ingestion:

    STEADY      the live cache is what queries read; shift mode stays here
    REBUILDING  a background STREAM job re-prefills frozen + retained rows
                while queries keep reading the live cache; the swap brings
                it back to STEADY
"""

from __future__ import annotations

from enum import Enum

from headstart.engine.states import IllegalTransition


class DataState(Enum):
    OPENING = "opening"
    LIVE = "live"
    FAILED = "failed"
    CLOSED = "closed"


class RetentionState(Enum):
    STEADY = "steady"
    REBUILDING = "rebuilding"


TRANSITIONS: dict[Enum, frozenset[Enum]] = {
    DataState.OPENING: frozenset({DataState.LIVE, DataState.CLOSED}),
    DataState.LIVE: frozenset({DataState.FAILED, DataState.CLOSED}),
    DataState.FAILED: frozenset({DataState.CLOSED}),
    DataState.CLOSED: frozenset(),
    RetentionState.STEADY: frozenset({RetentionState.REBUILDING}),
    RetentionState.REBUILDING: frozenset({RetentionState.STEADY}),
}


def advance(current: Enum, new: Enum) -> Enum:
    """`new` if the table allows the move (staying put is allowed), else IllegalTransition."""
    if new is current:
        return new
    if type(new) is not type(current) or new not in TRANSITIONS[current]:
        raise IllegalTransition(f"{type(current).__name__}: {current.name} -> {new.name} is not allowed")
    return new
