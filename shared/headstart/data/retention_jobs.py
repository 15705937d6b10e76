"""Retention's jobs, a part of `DataSession`: when the sliding region passes
its bound, `shift` drops the oldest rows' entries and re-rotates the rest
(no recompute, approximate, `retention.shift_out`), `rebuild` re-prefills
frozen + the retained rows in the background at STREAM while queries keep
reading the live cache, then swaps (exact).
"""

from __future__ import annotations

import time

from headstart.data.ingest import retention_cut
from headstart.data.retention import frozen_part, shift_out
from headstart.data.states import DataState, RetentionState, advance
from headstart.engine.requests.catch_up import start_catch_up
from headstart.engine.sched.jobs import Call, Priority
from headstart.engine.runner.rows import Row, RowResult


class RetentionJobs:
    """`DataSession`'s retention (its state lives on the session; worker thread)."""

    @property
    def sliding_tokens(self) -> int:
        return sum(len(entry.ids) for entry in self._segments)

    def _over(self) -> tuple[int, int]:
        """How many oldest rows (and their tokens) leave now (`retention_cut`,
        replayed from the region's first row: itself a cut)."""
        rows = retention_cut([len(entry.ids) for entry in self._segments], *self.settings.retention_window)
        return rows, sum(len(entry.ids) for entry in self._segments[:rows])

    def _retain(self) -> None:
        rows, tokens = self._over()
        if not rows:
            return
        if self.settings.retention == "shift":
            started = time.perf_counter()
            self._live = shift_out(self.runner.model, self._live, self.frozen_tokens, tokens)
            self.retention_seconds += time.perf_counter() - started
            with self._lock:
                del self._segments[:rows]
                self.counts["retired"] += rows
                self.counts["shifts"] += 1
        elif self.retention_state is RetentionState.STEADY:
            self.retention_state = advance(self.retention_state, RetentionState.REBUILDING)
            self._rebuild_cutoff = self._segments[rows - 1].seq
            self._rebuild_kv = None
            self._rebuild_job = self._enqueue(Call(self._rebuild_step, self._rebuild_commit), Priority.STREAM,
                                              "data-rebuild", background=True)

    def _retained_target(self) -> list[int]:
        kept = [t for e in self._segments if e.seq > self._rebuild_cutoff for t in e.ids]
        return self.prompt.frozen_ids + kept

    def _rebuild_step(self) -> Row | bool:
        """One chunk of the rebuild; rows ingested meanwhile join its target; when
        it holds the whole target the live cache is swapped (worker thread)."""
        if self.state is DataState.CLOSED:
            return False
        if self._rebuild_kv is None:
            self._rebuild_kv = frozen_part(self._live, self.frozen_tokens)
        target = self._retained_target()
        if self._rebuild_kv.ids == target:
            self._swap()
            return False
        job = self._rebuild_job
        chunk = self.runtime.limits.chunk_tokens
        if job is not None and job.token_cap is not None:  # answers wait (the scheduler's rule 2d)
            chunk = min(chunk, job.token_cap)
        catch_up = start_catch_up(self.runner, self._rebuild_kv, target, chunk, False,
                                  lambda: job is not None and job.preempt_requested)
        self._rebuilding = (catch_up, time.perf_counter())
        return catch_up.row

    def _rebuild_commit(self, row: Row, result: RowResult) -> bool:
        """A rebuild chunk ran (worker thread): count it; on a failure give up this
        rebuild (the live cache is intact; the next batch retries)."""
        (catch_up, started), self._rebuilding = self._rebuilding, None
        self.retention_seconds += time.perf_counter() - started
        self.counts["rebuild_tokens"] += len(catch_up.plan.chunk) if result.ran else 0
        if result.error is not None:
            self._rebuild_kv = None
            self.retention_state = advance(self.retention_state, RetentionState.STEADY)
            self.counts["rebuild_failures"] += 1
        return raise_or(result, True)

    def _swap(self) -> None:
        with self._lock:
            kept = [e for e in self._segments if e.seq > self._rebuild_cutoff]
            self.counts["retired"] += len(self._segments) - len(kept)
            self.counts["rebuilds"] += 1
            self._segments, self._live, self._rebuild_kv = kept, self._rebuild_kv, None
            self.retention_state = advance(self.retention_state, RetentionState.STEADY)
        self._ready.invalidate()  # same version, another cache
        self._retain()  # rows that arrived during the rebuild may be over the bound again
        self._ready.refresh(self)


def raise_or(result: RowResult, value: bool) -> bool:
    """`value`, or the row's error raised (a commit's plain case)."""
    if result.error is not None:
        raise result.error
    return value
