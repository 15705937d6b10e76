"""Run each candidate's SQL read-only with the execute edge's limits, off the caller's thread.

The containment is the evaluator's SQLite executor (`headstart.eval.executors.sqlite`,
which `/v1/execute` uses too): the file opened read-only with
`PRAGMA query_only`, an authorizer that allows reading only, one statement,
queries only, a deadline, a row cap. Each outcome keeps the result's
canonical key (for the choice) and its first rows (for the page).

`CandidateRunner.check` runs on a thread of its own: the forward worker
never waits for a database.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from headstart.candidates.choice import choose
from headstart.candidates.records import Candidate, CheckedChoice, RunOutcome
from headstart.eval.checked import not_run
from headstart.eval.result_key import result_key
from headstart.eval.executors.base import ExecLimits
from headstart.eval.executors.sqlite import SqliteExecutor

TRUNCATED_MARK = "…"


@dataclass(frozen=True)
class CandidateLimits:
    """A candidate's Run: `timeout_s` and `row_limit` as the execute edge's
    (past the row cap a Run fails, so no truncated result is grouped);
    `display_rows` rows of `cell_chars` characters at most are kept for the answer."""

    timeout_s: float = 5.0
    row_limit: int = 100_000
    display_rows: int = 20
    cell_chars: int = 4096

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.row_limit < 1 or self.display_rows < 0 or self.cell_chars < 16:
            raise ValueError("CandidateLimits: timeout_s > 0, row_limit >= 1, display_rows >= 0, cell_chars >= 16")


def display_cell(value, cell_chars: int):
    """A JSON-able cell: blobs as hex, long strings cut and marked."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).hex()
    if isinstance(value, str) and len(value) > cell_chars:
        return value[:cell_chars] + TRUNCATED_MARK
    return value


class CandidateRunner:
    """Runs candidates' SQL on SQLite files (one thread of its own; `close` when done)."""

    def __init__(self, limits: CandidateLimits | None = None):
        self.limits = limits or CandidateLimits()
        self._executor = SqliteExecutor(ExecLimits(self.limits.timeout_s, self.limits.row_limit))
        # one thread: the executor's connections are bound to the thread that opened them
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="candidate-sql")

    def _run_one(self, db_path: Path, candidate: Candidate) -> RunOutcome:
        """Run `candidate.sql` on `db_path` (the runner's thread)."""
        skipped = not_run(candidate.finish_reason)
        if skipped is not None:
            return RunOutcome(candidate.index, candidate.sql, None, error_code=skipped[0], error=skipped[1])
        out = self._executor.execute("", Path(db_path), candidate.sql)
        if not out.ok:
            return RunOutcome(candidate.index, candidate.sql, None, error_code=out.error_code, error=out.error,
                              elapsed_ms=out.elapsed_ms)
        shown = tuple(tuple(display_cell(v, self.limits.cell_chars) for v in row)
                      for row in out.result.rows[: self.limits.display_rows])
        return RunOutcome(candidate.index, candidate.sql, result_key(out.result), out.result.columns, shown,
                          len(out.result.rows), elapsed_ms=out.elapsed_ms)

    def _run_all(self, db_path: Path, candidates: Sequence[Candidate]) -> list[RunOutcome]:
        return [self._run_one(db_path, c) for c in candidates]

    def run(self, db_path: Path, candidates: Sequence[Candidate]) -> list[RunOutcome]:
        """Every candidate's outcome, in order (run on the runner's thread; this one waits)."""
        return self._thread.submit(self._run_all, db_path, list(candidates)).result()

    def check(self, db_path: Path, candidates: Sequence[Candidate]) -> "concurrent.futures.Future[CheckedChoice]":
        """The checked choice among `candidates`, computed on the runner's own thread."""
        return self._thread.submit(lambda: choose(self._run_all(db_path, list(candidates))))

    def close(self) -> None:
        self._thread.submit(self._executor.close).result()
        self._thread.shutdown()
