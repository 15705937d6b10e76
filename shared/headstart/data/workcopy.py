"""A data session's working copy of its SQLite database.

The catalogue file is copied into a private temp dir; accepted rows are
inserted there by the ingestion batch that puts them in the cache, each
under its sequence number (a data version is the seq of the newest row in
the cache). Each inserted row's (table, rowid, version) is kept in
a side table, so SQL runs on *exactly* a version the model saw: `execute`
opens a transaction, deletes the rows newer than that version, runs the
query and rolls back. Queries run read-only (an authorizer allows only
reads), with a step budget so a runaway query cannot hold the copy.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
from pathlib import Path

from headstart.data.rows import DataRow
from headstart.engine.errors import InvalidInput

_SIDE = "_headstart_row_versions"
# A row's own fault: a constraint (duplicate key, NOT NULL, CHECK), a value SQLite cannot
# hold (DataError: too big; OverflowError: an int beyond 64 bits, raised by the binding itself)
_ROW_REFUSALS = (sqlite3.IntegrityError, sqlite3.DataError, OverflowError)
_READ_OPS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


class SqlError(InvalidInput):
    """Generated SQL that does not run on the working copy (syntax, unknown name, a write)."""

    code = "SQL_ERROR"


class WorkingCopy:
    """Args:
        source: the catalogue's SQLite file (copied, never written).
        max_result_rows: rows an `execute` returns at most.
    """

    def __init__(self, source: str | Path, max_result_rows: int = 1000, max_steps: int = 10_000_000):
        self._dir = tempfile.TemporaryDirectory(prefix="headstart-data-")
        self.path = Path(self._dir.name) / "working.sqlite"
        shutil.copyfile(source, self.path)
        self.max_result_rows = max_result_rows
        self.max_steps = max_steps
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.execute(f"CREATE TABLE IF NOT EXISTS {_SIDE} (tbl TEXT, rid INTEGER, version INTEGER)")

    def rejects(self, rows: list[DataRow]) -> list[tuple[int, str]]:
        """A dry run of inserting `rows` in order (rolled back): the index and
        the database's message of each row it would refuse (a duplicate
        primary key, a constraint, a value too big), so those rows never
        reach the cache.

        Raises:
            sqlite3.Error: the database itself fails (a corrupt or unreadable
                file, I/O): not a row's fault, so no row is refused for it and
                the caller fails the session (issue 29).
        """
        refused = []
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN")
            try:
                for index, row in enumerate(rows):
                    cur.execute("SAVEPOINT one_row")
                    try:
                        cur.execute(*_insert(row))
                    except _ROW_REFUSALS as exc:
                        cur.execute("ROLLBACK TO one_row")
                        refused.append((index, f"{row.table}: {exc}"))
                    cur.execute("RELEASE one_row")
            finally:
                cur.execute("ROLLBACK")
        return refused

    def insert(self, rows: list[DataRow], versions: list[int]) -> None:
        """Insert `rows`, each under its data version (its seq), in one transaction."""
        if len(versions) != len(rows):
            raise ValueError("one version per row")
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN")
            try:
                for row, version in zip(rows, versions):
                    cur.execute(*_insert(row))
                    cur.execute(f"INSERT INTO {_SIDE} VALUES (?, ?, ?)", (row.table, cur.lastrowid, version))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def execute(self, sql: str, version: int) -> tuple[list[str], list[tuple]]:
        """Run `sql` read-only on the data as of `version`: (column names, rows).

        Raises:
            SqlError: the SQL fails, or tries to write.
        """
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN")
            try:
                newer = cur.execute(f"SELECT tbl, rid FROM {_SIDE} WHERE version > ?", (version,)).fetchall()
                for tbl, rid in newer:
                    cur.execute(f'DELETE FROM "{tbl}" WHERE rowid = ?', (rid,))
                self._conn.set_authorizer(lambda op, *_: sqlite3.SQLITE_OK if op in _READ_OPS else sqlite3.SQLITE_DENY)
                steps = [0]

                def budget() -> int:
                    steps[0] += 1
                    return 1 if steps[0] * 1000 > self.max_steps else 0

                self._conn.set_progress_handler(budget, 1000)
                try:
                    result = cur.execute(sql)
                    names = [d[0] for d in result.description or ()]
                    rows = result.fetchmany(self.max_result_rows)
                except sqlite3.Error as exc:
                    raise SqlError(f"the SQL does not run on data version {version}: {exc}") from exc
                finally:
                    self._conn.set_authorizer(None)
                    self._conn.set_progress_handler(None, 0)
                return names, rows
            finally:
                cur.execute("ROLLBACK")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self._dir.cleanup()


def _insert(row: DataRow) -> tuple[str, tuple]:
    cols = ", ".join(f'"{c}"' for c in row.columns)
    marks = ", ".join("?" for _ in row.columns)
    return f'INSERT INTO "{row.table}" ({cols}) VALUES ({marks})', row.values
