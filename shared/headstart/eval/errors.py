"""Typed errors of the evaluation harness.

Every error carries a short machine-readable `code` (what a caller or a report
row can act on) beside the human message. Executor failures on *predicted* SQL
are not raised: they are ordinary outcomes (`ExecOutcome.error_code`) because a
wrong or dangerous prediction is data, not a crash.
"""

from __future__ import annotations


class EvalError(Exception):
    """Base class: something the evaluation itself cannot go on with."""

    code = "eval_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class DatasetError(EvalError, ValueError):
    """A dataset name, file or layout is unknown or malformed."""

    code = "bad_dataset"


class ConfigError(EvalError, ValueError):
    """An option is invalid (unknown mode, rule set, executor; bad limit)."""

    code = "bad_config"


class ExecutorError(EvalError):
    """An executor cannot start: missing database, unreachable server."""

    code = "executor_unavailable"


class MigrationError(EvalError):
    """A SQLite database could not be copied into PostgreSQL."""

    code = "migration_failed"


class EngineUnavailableError(EvalError):
    """A model-backed mode was asked for but the serving engine is not importable."""

    code = "engine_unavailable"


class LocalPostgresError(EvalError):
    """A temporary local PostgreSQL could not be initialised or started."""

    code = "local_postgres_failed"
