"""Ready-position logits and the speculative exit (paper §3.9.4).

After each ingestion batch (and after a rebuild swap) a STREAM job extends a
share of the live cache by the prompt's question-less tail
(`DataPrompt.ready_ids`: the end of the user turn and the assistant's start)
and keeps the logits there: the model's next token before it has seen any
question, on that data version. One job at a time: if more batches land
while it runs, it runs again on the newest version.

With `DataSettings.ready_exit_gap` set, a query first checks them: when they
belong to the current version and cache, their top-1 minus top-2 logit is
above the threshold and the top token is a fast answer (the paper's
vocabulary V: a word of `DataSettings.ready_exit_vocabulary`, yes / no /
true / false / up / down by default, or an unsigned integer), the query
returns that token's text at once (`QueryResult.speculative`, no SQL), with
no forward at all. Approximate by design (the question is never read: one
answer for every question on that version). `describe()` counts
`ready_exits`, and `DataSession.ready_position()` lets a benchmark compare
the exit with the full answer. Nothing is computed while the setting is off.

Off by default, and restricted to V, because of what it does on a trained
model (`headstart bench ready-exit`, issue 30; docs/benchmarks.md): on the
Qwen2.5-Coder-0.5B with the data prompt, the ready top token opens an SQL
answer ("```", runner-up "Here", gap 0.18-1.31) at every measured version,
never a word that answers anything, and the full answers mostly start with
another token. Without V (the rule before issue 30) the exit would have
answered such queries with "```", never right. With V it does not fire on
this product's prompt; it stays for prompts whose answers are one word.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from headstart.data.answer import Snapshot, logit_gap
from headstart.data.states import DataState
from headstart.data.types import FAST_ANSWERS, QueryResult
from headstart.engine.sched.jobs import JobWork, Priority
from headstart.engine.runner.rows import Row, RowResult


def in_fast_vocabulary(text: str, vocabulary: frozenset[str] = FAST_ANSWERS) -> bool:
    """Whether a token's text is a fast answer: a word of `vocabulary`
    (stripped, case-folded) or an unsigned integer."""
    word = text.strip().lower()
    return word in vocabulary or (word.isascii() and word.isdigit())


@dataclass(frozen=True)
class ReadyPosition:
    """The ready-position logits of one data version: the top token, its
    text, the logit gap, and the snapshot's rows and context; `epoch` names
    the cache they were computed on (a rebuild swap starts a new one)."""

    version: int
    epoch: int
    token: int
    text: str
    gap: float
    rows: int
    context: int
    logits: torch.Tensor = field(repr=False)


class ReadyLogits:
    """A data session's ready position, refreshed by its own STREAM job."""

    def __init__(self):
        self.current: ReadyPosition | None = None
        self.epoch = 0  # bumped when the live cache is replaced at the same version
        self._job = None
        self._again = False
        self._lock = threading.Lock()

    @property
    def job(self):
        """The refresh job in flight, or None."""
        return self._job

    def invalidate(self) -> None:
        """The live cache changed without a new version (a rebuild swap)."""
        with self._lock:
            self.epoch += 1

    def refresh(self, session) -> None:
        """Bring the ready position to the session's current version (worker
        thread, after a commit); nothing while the exit is off."""
        if session.settings.ready_exit_gap is None or session.state is DataState.CLOSED:
            return
        with self._lock:
            if self._job is not None:
                self._again = True  # the running job goes once more, on the newest version
                return
            self._again = False
            self._job = session._enqueue(_ReadyWork(self, session), Priority.STREAM, "data-ready")

    def _step(self, session) -> "tuple[Row, tuple] | None":
        """The ready row on the newest snapshot, with what its commit needs; None: closed."""
        with self._lock:
            if session.state is DataState.CLOSED:
                self._job = None
                return None
            epoch = self.epoch
        snapshot: Snapshot = session._snapshot()
        kv = snapshot.kv.share()
        return Row(kv, session.prompt.ready_ids(), True, runner=session.runner), (snapshot, epoch)

    def _commit(self, session, row: Row, result: RowResult, snapshot: Snapshot, epoch: int) -> bool:
        if result.error is not None:
            with self._lock:
                self._job = None
            raise result.error
        if not result.ran:  # it yielded to a more urgent job: try again
            return True
        logits = row.state.last_logits
        token = int(torch.argmax(logits))
        position = ReadyPosition(snapshot.version, epoch, token, session.prompt.decode([token]),
                                 logit_gap(logits), snapshot.rows, snapshot.context, logits.clone())
        with self._lock:
            self.current = position
            more, self._again = self._again, False
            if not more:
                self._job = None
        with session._lock:
            session.counts["ready_refreshes"] += 1
        return more

    def usable(self, session) -> ReadyPosition | None:
        """The ready position if it stands for the session's current cache and version."""
        with self._lock:
            position = self.current
            if position is None or position.epoch != self.epoch or position.version != session.data_version:
                return None
            return position

    def exit(self, session, started: float) -> QueryResult | None:
        """A speculative answer (module doc), or None: the query runs in full."""
        threshold = session.settings.ready_exit_gap
        if threshold is None:
            return None
        position = self.usable(session)
        if position is None or not position.gap > threshold or position.token in session.runtime.stop_ids:
            return None
        if not in_fast_vocabulary(position.text, session.settings.ready_exit_vocabulary):
            return None  # the first token of a longer answer ("```", "SELECT"), not an answer
        with session._lock:
            session.counts["ready_exits"] += 1
            session.counts["queries"] += 1
        # a fast answer is a word, not SQL: nothing to execute
        return QueryResult(position.text, "", position.version, position.rows,
                           position.context, [position.token], position.logits, time.perf_counter() - started,
                           speculative=True)


class _ReadyWork(JobWork):
    """The job that brings the ready position to the session's newest version."""

    def __init__(self, ready: ReadyLogits, session):
        self.ready, self.session = ready, session
        self._pending: tuple | None = None

    def step(self) -> Row | bool:
        out = self.ready._step(self.session)
        if out is None:
            return False
        row, self._pending = out
        return row

    def commit(self, row: Row, result: RowResult) -> bool:
        (snapshot, epoch), self._pending = self._pending, None
        return self.ready._commit(self.session, row, result, snapshot, epoch)
