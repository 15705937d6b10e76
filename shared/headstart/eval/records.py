"""The typed objects that cross the evaluation's layers.

dataset → `EvalQuestion` → generator → `Generation` → extract → executor →
`ExecOutcome` (holding a `ResultSet`) → compare → `QuestionResult` → report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Codes an executor puts in `ExecOutcome.error_code`.
EXEC_TIMEOUT = "timeout"
EXEC_DENIED = "denied"
EXEC_ROW_LIMIT = "row_limit"
EXEC_SQL_ERROR = "sql_error"
EXEC_EMPTY_SQL = "empty_sql"
EXEC_MULTIPLE_STATEMENTS = "multiple_statements"

# Values of `QuestionResult.status`.
STATUS_SCORED = "scored"
STATUS_SKIPPED = "skipped"
STATUS_GOLD_ERROR = "gold_error"


@dataclass(frozen=True)
class EvalQuestion:
    """One question to evaluate.

    `index` is the position in the dataset file (stable across runs, used to
    pair modes); `db_path` is the SQLite file the gold and predicted SQL run on,
    None when it is missing, in which case `skip_reason` says why.
    """

    index: int
    question_id: str
    db_id: str
    question: str
    gold_sql: str
    db_path: Path | None
    evidence: str = ""
    difficulty: str = ""
    skip_reason: str | None = None

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None


@dataclass(frozen=True)
class Generation:
    """What a generator produced for one question.

    `text` is the raw model answer (SQL is extracted from it later);
    `ttft_ms` is the time to first token the serving path measured, None for
    paths without a model (gold); `extra` is free-form detail for the report.
    """

    text: str
    ttft_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResultSet:
    """Rows a query returned, in the order the database returned them."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class ExecOutcome:
    """The result of running one SQL string: rows, or an error code and message."""

    result: ResultSet | None
    elapsed_ms: float
    error_code: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.error_code is None


@dataclass
class QuestionResult:
    """One row of eval.json: a question, what was predicted, and how it scored.

    `correct` and `exact` are None unless `status == "scored"`.
    """

    index: int
    question_id: str
    db_id: str
    question: str
    gold_sql: str
    status: str
    pred_text: str = ""
    pred_sql: str = ""
    correct: bool | None = None
    exact: bool | None = None
    ttft_ms: float | None = None
    pred_error_code: str | None = None
    pred_error: str = ""
    gold_error: str = ""
    skip_reason: str | None = None
    gen_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
