"""Typing sessions: a user's evolving cache while they type, and the table of them.

- `session.Session`: one user, one database, one cache (`update`, `submit`, `close`).
- `typing_work.TypingWork`: the session's typing job (catch the cache up to the policy's target).
- `answer_ahead`: the greedy answer decoded during a pause (`AnswerAhead`, `AheadWork`).
- `policy`: what to put in the cache now (`headstart`, `paper`) and while riding with answers.
- `table.SessionTable`: a process's sessions, bounded by count and KV bytes (LRU eviction).
- `records`: `SessionLimits`, `SessionStats`.
"""

from headstart.engine.sessions.policy import ConfirmationPolicy, make_policy
from headstart.engine.sessions.records import SessionLimits, SessionStats
from headstart.engine.sessions.session import Session
from headstart.engine.sessions.table import SessionTable

__all__ = ["ConfirmationPolicy", "Session", "SessionLimits", "SessionStats", "SessionTable", "make_policy"]
