"""The databases a gateway offers (Spider ids) and a read-only Run for the page."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from headstart.client.errors import ApiError
from headstart.paths import default_spider_dir


@dataclass(frozen=True)
class DatabaseInfo:
    id: str
    num_tables: int
    can_execute: bool


def list_spider_databases(spider_dir: Path | None = None) -> list[DatabaseInfo]:
    """Spider ids of `tables.json`, sorted; empty when the data is absent."""
    from headstart.schema.spider_json import load_spider_tables

    spider_dir = Path(spider_dir) if spider_dir else default_spider_dir()
    tables = spider_dir / "tables.json"
    if not tables.is_file():
        return []
    schemas = load_spider_tables(tables)
    return [
        DatabaseInfo(db, len(schema.tables), (spider_dir / "database" / db / f"{db}.sqlite").is_file())
        for db, schema in sorted(schemas.items())
    ]


def run_read_only(db: str, sql: str, row_limit: int, timeout_s: float, spider_dir: Path | None = None) -> dict:
    """The first `row_limit` rows of `sql` on a Spider database, read-only and
    contained (the evaluator's authorizer: only reads; a deadline).

    Raises:
        ApiError: NOT_FOUND (no SQLite file), INVALID_ARGUMENT (the SQL failed).
    """
    from headstart.eval.executors.base import precheck
    from headstart.eval.executors.sqlite import connect_read_only

    spider_dir = Path(spider_dir) if spider_dir else default_spider_dir()
    if not db.replace("_", "").isalnum():
        raise ApiError("INVALID_ARGUMENT", f"bad database id {db!r}")
    path = spider_dir / "database" / db / f"{db}.sqlite"
    if not path.is_file():
        raise ApiError("NOT_FOUND", f"no SQLite file for database {db!r}")
    rejected = precheck(sql)
    if rejected is not None:
        raise ApiError("INVALID_ARGUMENT", rejected.error or "not a read-only query")
    conn = connect_read_only(path)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchmany(row_limit)
        columns = [d[0] for d in cursor.description or ()]
    except (sqlite3.Error, sqlite3.Warning) as exc:
        raise ApiError("INVALID_ARGUMENT", f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    return {"columns": columns, "rows": [[_jsonable(v) for v in row] for row in rows]}


def _jsonable(value):
    if isinstance(value, bytes):
        return value.hex()
    return value
