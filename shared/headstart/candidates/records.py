"""The objects of an execution-checked answer: a candidate, what its SQL did, the choice."""

from __future__ import annotations

from dataclasses import dataclass, field

GREEDY_INDEX = 0  # candidate 0 is the greedy answer; 1..K-1 are sampled (seed + index)


@dataclass(frozen=True)
class Candidate:
    """One finished answer of a candidate set.

    Attributes:
        index: 0 for the greedy answer, i for the sampled one seeded `seed + i`.
        text: the answer as decoded; `sql` is what `extract_sql` takes of it.
        finish_reason: "stop", "length", "bounded" (past the greedy answer's length + its
            slack: not run), "cancelled" or "error".
    """

    index: int
    text: str
    sql: str
    token_ids: tuple[int, ...] = ()
    finish_reason: str = "stop"

    @classmethod
    def of(cls, answer) -> "Candidate":
        """The candidate of an engine's `CandidateAnswer` (its SQL extracted from its text)."""
        from headstart.eval.extract import extract_sql

        return cls(answer.index, answer.text, extract_sql(answer.text), tuple(answer.token_ids), answer.finish_reason)


@dataclass(frozen=True)
class RunOutcome:
    """What one candidate's SQL returned when run read-only.

    `key` is the canonical result key (`result_key`) when it ran, None when
    it failed (`error_code`, `error`). `columns` and `rows` are the first
    `CandidateLimits.display_rows` rows, as `/v1/execute` returns them;
    `num_rows` counts them all.
    """

    index: int
    sql: str
    key: str | None
    columns: tuple[str, ...] = ()
    rows: tuple[tuple, ...] = ()
    num_rows: int = 0
    error_code: str | None = None
    error: str = ""
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.key is not None


@dataclass(frozen=True)
class CheckedChoice:
    """The execution-checked answer of a candidate set.

    Attributes:
        index: the chosen candidate (0: the greedy answer's group won, or every candidate failed).
        sql: its SQL; `columns`, `rows`: its first rows (empty when it failed).
        agreed: how many candidates returned the chosen result (0 when every one failed).
        num_candidates: how many candidates were checked.
        failed: the indexes of the candidates whose SQL failed.
        error: the greedy answer's error when every candidate failed, else None.
        outcomes: every candidate's `RunOutcome`, by index.
    """

    index: int
    sql: str
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]
    agreed: int
    num_candidates: int
    failed: tuple[int, ...]
    error: str | None = None
    outcomes: tuple[RunOutcome, ...] = field(default=(), repr=False)

    @property
    def changed(self) -> bool:
        """The choice is not the greedy answer's SQL."""
        return self.index != GREEDY_INDEX

    def to_dict(self) -> dict:
        """A JSON-able view (the page's and the APIs' `choice` message)."""
        return {"index": self.index, "sql": self.sql, "columns": list(self.columns),
                "rows": [list(row) for row in self.rows], "agreed": self.agreed,
                "num_candidates": self.num_candidates, "failed": list(self.failed), "error": self.error}
