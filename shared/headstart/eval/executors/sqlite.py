"""Execute SQL on a dataset's SQLite file, read-only and contained.

Containment, layer by layer:
- the file is opened with `mode=ro` and `PRAGMA query_only`, so no write can land;
- an authorizer allows only reading (SELECT, READ, functions, recursive CTEs):
  DROP, INSERT, ATTACH/DETACH, PRAGMA and transactions are denied up front;
  `load_extension`, `readfile` and `writefile` are denied as functions;
- a progress handler interrupts a query past its deadline (a 10^9-row cross
  join stops after `timeout_s`, while it runs or while its rows are fetched);
- at most `row_limit` + 1 rows are fetched, strings and blobs are capped.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from headstart.eval.errors import ExecutorError
from headstart.eval.executors.base import ExecLimits, precheck
from headstart.eval.records import (
    EXEC_DENIED,
    EXEC_ROW_LIMIT,
    EXEC_SQL_ERROR,
    EXEC_TIMEOUT,
    ExecOutcome,
    ResultSet,
)
from headstart.eval.sqlnorm import database_names

_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}
_PROGRESS_OPS = 10_000  # VM instructions between deadline checks (~tens of microseconds)
_MAX_VALUE_BYTES = 10_000_000  # longest string or blob a query may build


def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def connect_read_only(db_path: Path) -> sqlite3.Connection:
    """A contained read-only connection to `db_path` (see the module docstring)."""
    if not Path(db_path).is_file():
        raise ExecutorError(f"SQLite database not found: {db_path}")
    conn = sqlite3.connect(f"file:{quote(str(db_path))}?mode=ro", uri=True)
    # NOTE: Spider has a few non-UTF-8 strings; Spider's own evaluator decodes leniently too.
    conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
    conn.execute("PRAGMA query_only = ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
    conn.set_authorizer(_authorize)  # last: the PRAGMA above would be denied
    return conn


class SqliteExecutor:
    """Runs queries on DIR/<db>/<db>.sqlite files; one cached connection per file."""

    name = "sqlite"

    def __init__(self, limits: ExecLimits | None = None) -> None:
        self.limits = limits or ExecLimits()
        self._conns: dict[Path, sqlite3.Connection] = {}
        self._names: dict[Path, frozenset[str]] = {}

    def execute(self, db_id: str, db_path: Path, sql: str) -> ExecOutcome:
        rejected = precheck(sql)
        if rejected is not None:
            return rejected
        conn = self._conn(db_path)
        started = time.perf_counter()
        deadline = time.monotonic() + self.limits.timeout_s
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_OPS)
        cursor = None
        try:
            cursor = conn.execute(sql)
            rows = cursor.fetchmany(self.limits.row_limit + 1)
            columns = tuple(d[0] for d in cursor.description or ())
        except (sqlite3.Error, sqlite3.Warning) as exc:
            return ExecOutcome(None, _ms(started), _error_code(exc), f"{type(exc).__name__}: {exc}")
        finally:
            if cursor is not None:
                cursor.close()
            conn.set_progress_handler(None, 0)
        if len(rows) > self.limits.row_limit:
            return ExecOutcome(None, _ms(started), EXEC_ROW_LIMIT, f"more than {self.limits.row_limit} rows")
        return ExecOutcome(ResultSet(columns, tuple(rows)), _ms(started))

    def known_names(self, db_id: str, db_path: Path) -> frozenset[str]:
        if db_path not in self._names:
            self._names[db_path] = database_names(db_path)
        return self._names[db_path]

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def _conn(self, db_path: Path) -> sqlite3.Connection:
        if db_path not in self._conns:
            self._conns[db_path] = connect_read_only(db_path)
        return self._conns[db_path]


def _error_code(exc: Exception) -> str:
    message = str(exc).lower()
    if "interrupted" in message:
        return EXEC_TIMEOUT
    if any(word in message for word in ("not authorized", "authorization denied", "prohibited", "readonly")):
        return EXEC_DENIED
    return EXEC_SQL_ERROR


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
