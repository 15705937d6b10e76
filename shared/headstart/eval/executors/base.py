"""The executor contract: run one SQL string on one database, contained.

An executor is picked once per run from `executors.EXECUTORS` and asked, for
every scored question, to run the gold SQL and the predicted SQL. Predicted SQL
is untrusted: it may write, attach files, loop for ever or return a billion
rows. Each executor must therefore (a) never change the database, (b) stop a
query after `ExecLimits.timeout_s`, and (c) read at most `row_limit` rows. A
failure is an `ExecOutcome` with an error code, never an exception.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from headstart.eval.errors import ConfigError
from headstart.eval.extract import split_statements
from headstart.eval.records import EXEC_DENIED, EXEC_EMPTY_SQL, EXEC_MULTIPLE_STATEMENTS, ExecOutcome

QUERY_KEYWORDS = ("select", "with", "values")
# The first word, after any comments and opening parentheses.
_LEADING_WORD = re.compile(r"^(?:\s|--[^\n]*\n|/\*.*?\*/|\()*([A-Za-z]+)", re.DOTALL)


@dataclass(frozen=True)
class ExecLimits:
    """Containment limits for every query (gold and predicted alike)."""

    timeout_s: float = 30.0
    row_limit: int = 100_000

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.row_limit <= 0:
            raise ConfigError(f"row_limit must be positive, got {self.row_limit}")


class Executor(Protocol):
    """Runs SQL on the database of a question."""

    name: str

    def execute(self, db_id: str, db_path: Path, sql: str) -> ExecOutcome:
        """Run `sql` on `db_id` (whose SQLite original is `db_path`); called per gold and per prediction."""
        ...

    def known_names(self, db_id: str, db_path: Path) -> frozenset[str]:
        """Lower-cased table and column names of the database (for SQL normalisation)."""
        ...

    def close(self) -> None:
        """Release connections; called once when the run ends."""
        ...


def precheck(sql: str) -> ExecOutcome | None:
    """Reject, before any database sees them: empty SQL, several statements, non-queries.

    This is the first of the containment layers, not the only one: each
    executor also opens its database so that a write cannot land.
    """
    started = time.perf_counter()
    statements = split_statements(sql)
    if not statements:
        return ExecOutcome(None, _ms_since(started), EXEC_EMPTY_SQL, "no SQL to execute")
    if len(statements) > 1:
        return ExecOutcome(
            None, _ms_since(started), EXEC_MULTIPLE_STATEMENTS,
            f"{len(statements)} statements; only one query is executed",
        )
    keyword = _LEADING_WORD.match(statements[0])
    if keyword is None or keyword.group(1).lower() not in QUERY_KEYWORDS:
        word = keyword.group(1) if keyword else statements[0][:20]
        return ExecOutcome(
            None, _ms_since(started), EXEC_DENIED,
            f"only queries ({', '.join(QUERY_KEYWORDS).upper()}) are executed, not {word!r}",
        )
    return None


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
