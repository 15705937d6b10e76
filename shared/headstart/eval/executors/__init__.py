"""Executors: where gold and predicted SQL run. Picked by name from `EXECUTORS`."""

from __future__ import annotations

from headstart.eval.errors import ConfigError
from headstart.eval.executors.base import ExecLimits, Executor

EXECUTOR_NAMES = ("sqlite", "postgres")


def build_executor(
    name: str, limits: ExecLimits, postgres_dsn: str | None = None, pg_schema_prefix: str = ""
) -> Executor:
    """The executor called `name`; ConfigError listing the valid names otherwise.

    `postgres` needs `postgres_dsn` (the CLI starts a local server when none is given);
    each database goes into schema `<pg_schema_prefix><db_id>`.
    """
    if name == "sqlite":
        from headstart.eval.executors.sqlite import SqliteExecutor

        return SqliteExecutor(limits)
    if name == "postgres":
        if not postgres_dsn:
            raise ConfigError("the postgres executor needs a DSN (--postgres-dsn or HEADSTART_POSTGRES_DSN)")
        from headstart.eval.executors.postgres import PostgresExecutor

        return PostgresExecutor(postgres_dsn, limits, schema_prefix=pg_schema_prefix)
    raise ConfigError(f"unknown executor {name!r}; valid: {', '.join(EXECUTOR_NAMES)}")


__all__ = ["EXECUTOR_NAMES", "ExecLimits", "Executor", "build_executor"]
