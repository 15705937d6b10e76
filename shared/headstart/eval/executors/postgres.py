"""Execute SQL on a Spider database migrated into PostgreSQL (the APITS setup: PostgreSQL 15).

Each database lives in its own schema (migrated on first use, see pg_migrate).
SQLite-flavoured SQL is ported with sqlglot (sqlnorm.to_postgres) before it
runs. Containment:
- every query runs in a READ ONLY transaction that is rolled back afterwards;
- as a role that may only read the migrated schemas (when the DSN's user may
  create roles; otherwise READ ONLY alone guards, and `notes` says so);
- through a server-side cursor (DECLARE only accepts a query, so no DDL, no
  SET ROLE), fetching at most `row_limit` + 1 rows;
- under `statement_timeout`, which stops a 10^9-row cross join.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql as pgsql

from headstart.eval.errors import ExecutorError
from headstart.eval.executors.base import ExecLimits, precheck
from headstart.eval.executors.pg_migrate import MigrationReport, migrate_sqlite
from headstart.eval.records import EXEC_DENIED, EXEC_ROW_LIMIT, EXEC_SQL_ERROR, EXEC_TIMEOUT, ExecOutcome, ResultSet
from headstart.eval.executors.pg_catalog import column_types
from headstart.eval.executors.pg_compat import sqlglot_schema
from headstart.eval.executors.pg_dialect import to_postgres
from headstart.eval.sqlnorm import database_names

READER_ROLE = "headstart_eval_reader"
_DENIED = (pgerrors.ReadOnlySqlTransaction, pgerrors.InsufficientPrivilege)


class PostgresExecutor:
    """Runs queries on PostgreSQL schemas migrated from the dataset's SQLite files."""

    name = "postgres"

    def __init__(self, dsn: str, limits: ExecLimits | None = None, schema_prefix: str = "") -> None:
        self.limits = limits or ExecLimits()
        self.schema_prefix = schema_prefix
        try:
            self._admin = psycopg.connect(dsn)
            self._reader = psycopg.connect(dsn)
        except psycopg.Error as exc:
            raise ExecutorError(f"cannot connect to PostgreSQL: {exc}") from exc
        self._reader.read_only = True
        self.migrations: dict[str, MigrationReport] = {}
        self._names: dict[str, frozenset[str]] = {}
        self._types: dict[str, dict[str, dict[str, str]]] = {}
        self.notes: list[str] = []
        self._role = self._create_reader_role()

    def schema_for(self, db_id: str) -> str:
        return f"{self.schema_prefix}{db_id}".lower()

    def execute(self, db_id: str, db_path: Path, sql: str) -> ExecOutcome:
        rejected = precheck(sql)
        if rejected is not None:
            return rejected
        schema = self._ensure(db_id, db_path)
        ported = to_postgres(sql, self.known_names(db_id, db_path), self._types[db_id])
        started = time.perf_counter()
        conn = self._reader
        try:
            conn.execute("SELECT set_config('statement_timeout', %s, true), set_config('search_path', %s, true)",
                         (f"{int(self.limits.timeout_s * 1000)}ms", pgsql.Identifier(schema).as_string(conn)))
            if self._role:
                conn.execute(pgsql.SQL("SET LOCAL ROLE {}").format(pgsql.Identifier(self._role)))
            with conn.cursor(name="headstart_eval") as cursor:
                cursor.execute(ported)
                rows = cursor.fetchmany(self.limits.row_limit + 1)
                columns = tuple(d.name for d in cursor.description or ())
        except psycopg.Error as exc:
            return ExecOutcome(None, _ms(started), _error_code(exc), f"{type(exc).__name__}: {exc}".strip())
        finally:
            conn.rollback()
        if len(rows) > self.limits.row_limit:
            return ExecOutcome(None, _ms(started), EXEC_ROW_LIMIT, f"more than {self.limits.row_limit} rows")
        return ExecOutcome(ResultSet(columns, tuple(tuple(r) for r in rows)), _ms(started))

    def known_names(self, db_id: str, db_path: Path) -> frozenset[str]:
        if db_id not in self._names:
            self._names[db_id] = database_names(db_path)
        return self._names[db_id]

    def close(self) -> None:
        self._reader.close()
        self._admin.close()

    def _ensure(self, db_id: str, db_path: Path) -> str:
        """Migrate `db_id` on first use and grant the reader role access to it."""
        schema = self.schema_for(db_id)
        if db_id not in self.migrations:
            report = migrate_sqlite(self._admin, db_path, schema)
            self.migrations[db_id] = report
            self.notes += [f"{schema}: {note}" for note in report.notes]
            self._types[db_id] = sqlglot_schema(column_types(self._admin, schema))
            if self._role:
                ident, role = pgsql.Identifier(schema), pgsql.Identifier(self._role)
                with self._admin.transaction():
                    self._admin.execute(pgsql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(ident, role))
                    self._admin.execute(pgsql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(ident, role))
        return schema

    def _create_reader_role(self) -> str | None:
        try:
            with self._admin.transaction():
                exists = self._admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (READER_ROLE,)).fetchone()
                if not exists:
                    self._admin.execute(pgsql.SQL("CREATE ROLE {} NOLOGIN").format(pgsql.Identifier(READER_ROLE)))
                user = self._admin.execute("SELECT current_user").fetchone()[0]
                self._admin.execute(pgsql.SQL("GRANT {} TO {}").format(
                    pgsql.Identifier(READER_ROLE), pgsql.Identifier(user)))
        except psycopg.Error as exc:
            self.notes.append(f"no read-only role ({exc}); queries are guarded by READ ONLY transactions only")
            return None
        return READER_ROLE


def _error_code(exc: psycopg.Error) -> str:
    if isinstance(exc, pgerrors.QueryCanceled):
        return EXEC_TIMEOUT
    if isinstance(exc, _DENIED):
        return EXEC_DENIED
    return EXEC_SQL_ERROR


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
