"""A data session's charge to its replica's KV memory (the paper's cell budget, §3.7).

Every cache a data session holds is counted in the runtime's `KVMemory`
beside the typing sessions and the P0 store (`SessionTable.admit_holder`),
so Describe and the replica's metrics see it: the live cache, a rebuild in
flight, and the tails of the queries and flash answers running on it.

Admission counts what the session holds *and* what it has accepted and will
hold (`charged_bytes`), so an accepted row always has its cell:

- the live cache as it will be once the buffered rows are in (frozen +
  sliding + buffered tokens; `shift` retention cuts it back after each
  batch, so at most the bound plus one chunk),
- with `rebuild` retention, a second cache of frozen + the bound while the
  rows pass it (the background re-prefill builds it beside the live one),
- the answers' tails, at least the runtime's session reserve (a question
  and its answer).

Opening (with the rows of a rebuild) and each push ask for the growth they
bring; past the budget (after evicting idle typing sessions, the typing
sessions' own rule) they fail with ResourceExhausted and change nothing:
the session stays usable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DataCharge:
    """The `KVHolder` of one data session (registered while it is open)."""

    def __init__(self, session):
        self.session = session
        self.table = session.runtime.sessions
        memory = session.runtime.kv_memory
        self.bytes_per_token, self.reserve_bytes = memory.bytes_per_token, memory.session_reserve_bytes
        self._opening_tokens = 0  # while OPENING: the tokens the open will hold
        self._held = False

    # -- KVHolder ---------------------------------------------------------------------------

    def kv_bytes(self) -> int:
        s = self.session
        with s._lock:
            live, rebuild = getattr(s, "_live", None), s._rebuild_kv
            tails = sum(answer.tail_bytes for answer in s._answers)
        return (live.nbytes() if live is not None else 0) + (rebuild.nbytes() if rebuild else 0) + tails

    def charged_bytes(self, extra_tokens: int = 0) -> int:
        """What admission counts (module doc), with `extra_tokens` more rows accepted."""
        s, settings = self.session, self.session.settings
        with s._lock:
            live, rebuild = getattr(s, "_live", None), s._rebuild_kv
            tails = sum(answer.tail_bytes for answer in s._answers)
            sliding = sum(len(e.ids) for e in s._segments)
            pending = sum(len(e.ids) for e in s._buffer) + extra_tokens
        coming = sliding + pending
        if settings.retention == "shift":
            coming = min(coming, settings.retention_tokens + s.runtime.limits.chunk_tokens)
        tokens = max(s.frozen_tokens + coming, self._opening_tokens)
        live_bytes = max(live.nbytes() if live is not None else 0, tokens * self.bytes_per_token)
        rebuild_bytes = rebuild.nbytes() if rebuild is not None else 0
        if settings.retention == "rebuild" and (rebuild is not None or sliding + pending > settings.retention_tokens):
            rebuild_bytes = max(rebuild_bytes, (s.frozen_tokens + settings.retention_tokens) * self.bytes_per_token)
        return live_bytes + rebuild_bytes + max(tails, self.reserve_bytes)

    # -- admission --------------------------------------------------------------------------

    def admit(self, tokens: int) -> None:
        """Register the session, about to hold `tokens` (its frozen region and
        a rebuild's retained rows). Raises ResourceExhausted past the budget."""
        self._opening_tokens = tokens
        self.table.admit_holder(self, self.charged_bytes())
        self._held = True

    def opened(self) -> None:
        self._opening_tokens = 0

    def push(self, tokens: int, then: Callable[[], T]) -> T:
        """Run `then` (buffering `tokens` of rows) if their cells fit, else ResourceExhausted."""
        need = self.charged_bytes(tokens) - self.charged_bytes()
        return self.table.charge(need, then)

    def release(self) -> None:
        if self._held:
            self.table.release_holder(self)
            self._held = False
