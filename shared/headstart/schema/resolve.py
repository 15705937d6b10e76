"""Turn a user's database spec into a loaded schema and the means to query it.

A spec is one of:
- a PostgreSQL URI (`postgresql://...` or `postgres://...`);
- a path to a SQLite file (`.sqlite`, `.sqlite3`, `.db`, or any path that
  exists and is not a Spider id);
- a Spider db id, looked up in `<spider_dir>/tables.json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from headstart.paths import default_spider_dir
from headstart.schema.dsn import is_postgres_dsn
from headstart.schema.model import Schema, SchemaError
from headstart.schema.postgres import load_postgres_schema
from headstart.schema.spider_json import describe_close_matches, load_spider_tables
from headstart.schema.sqlite import load_sqlite_schema

DatabaseKind = Literal["spider", "sqlite", "postgres"]
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


@dataclass(frozen=True)
class ResolvedDatabase:
    """A resolved spec: its schema, and where queries against it run.

    `sqlite_path` (absolute) is set for SQLite files and for Spider ids whose
    file is present (Spider's wta_1 ships without one); `dsn` is set for PostgreSQL
    and holds the password, so it is kept out of the repr.
    """

    schema: Schema
    kind: DatabaseKind
    sqlite_path: Path | None = None
    dsn: str | None = field(default=None, repr=False)


def resolve_database(spec: str, spider_dir: str | Path | None = None) -> ResolvedDatabase:
    """Load the schema named by `spec` (see the module docstring for the forms).

    For a Spider id the schema comes from the database's SQLite file when it
    exists (tables.json drops all but the first column of composite primary
    keys in 8 dev tables and has only coarse types), and from tables.json
    otherwise, so ids whose file is missing (wta_1) still resolve.

    Raises:
        SchemaError: the spec is none of the forms (the message says what was
            tried), or the database it names cannot be loaded.
    """
    spec = spec.strip()
    if not spec:
        raise SchemaError(
            "empty database spec: give a Spider db id, a SQLite path or a postgresql:// DSN"
        )
    if is_postgres_dsn(spec):
        return ResolvedDatabase(load_postgres_schema(spec), "postgres", dsn=spec)
    path = Path(spec).expanduser()
    if path.suffix.lower() in SQLITE_SUFFIXES or "/" in spec or "\\" in spec:
        return _sqlite(path)

    spider_dir = Path(spider_dir) if spider_dir is not None else default_spider_dir()
    tables_json = spider_dir / "tables.json"
    schemas = load_spider_tables(tables_json) if tables_json.is_file() else None
    if schemas is not None and spec in schemas:
        sqlite_path = (spider_dir / "database" / spec / f"{spec}.sqlite").resolve()
        if sqlite_path.is_file():
            return ResolvedDatabase(load_sqlite_schema(sqlite_path, db_id=spec), "spider", sqlite_path)
        return ResolvedDatabase(schemas[spec], "spider", None)
    if path.is_file():
        return _sqlite(path)

    if schemas is not None:
        hint = describe_close_matches(spec, list(schemas))
        spider_note = f"not a Spider db id in {str(tables_json)!r} ({hint})"
    else:
        spider_note = f"not a Spider db id (no {str(tables_json)!r})"
    raise SchemaError(
        f"cannot resolve database {spec!r}: not a PostgreSQL DSN (postgresql:// or postgres://), "
        f"not a SQLite file (no file {str(path)!r}), {spider_note}"
    )


def _sqlite(path: Path) -> ResolvedDatabase:
    path = path.resolve()  # absolute: the path is used later, maybe from another directory
    return ResolvedDatabase(load_sqlite_schema(path), "sqlite", sqlite_path=path)
