"""Copy a Spider SQLite database into its own PostgreSQL schema, types and keys kept.

Order of work, in one transaction: create the tables (lower-case names, so
SQLite-style unquoted SQL finds them), COPY the rows, add primary keys, then
foreign keys. Spider's data is not always consistent with its declared keys,
so each key is tried in a savepoint and a failure is reported, never hidden:
- a foreign key whose rows violate it is added `NOT VALID` (declared, enforced
  for new rows, existing rows unchecked);
- a foreign key to columns without a unique constraint first gets that UNIQUE
  constraint when the data allows it (PostgreSQL requires one), else is skipped;
- a column whose values do not fit its declared type falls back (pg_types);
- a TEXT key column referencing an INTEGER key takes the INTEGER type when
  every value is a canonical integer, so the foreign key can exist.
The schema is stamped with the file's sha256; a later call with the same file
reuses it.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import psycopg
from psycopg import sql as pgsql

from headstart.eval.errors import MigrationError
from headstart.eval.executors.pg_catalog import ForeignKeyInfo, foreign_keys, row_counts
from headstart.eval.executors.pg_types import ColumnType, choose_type, convert
from headstart.eval.executors.sqlite import connect_read_only

_STAMP = "headstart sqlite sha256="


@dataclass
class MigrationReport:
    """What a migration did: rows per table, the foreign keys declared, and every compromise."""

    schema: str
    source_sha256: str
    row_counts: dict[str, int]
    foreign_keys: list[ForeignKeyInfo]
    notes: list[str] = field(default_factory=list)
    reused: bool = False


@dataclass(frozen=True)
class _Table:
    name: str  # lower-cased
    columns: tuple[str, ...]  # lower-cased
    types: tuple[ColumnType, ...]
    not_null: tuple[bool, ...]
    primary_key: tuple[str, ...]
    rows: list[tuple]


def migrate_sqlite(conn: psycopg.Connection, sqlite_path: Path, schema: str, *, force: bool = False) -> MigrationReport:
    """Create (or reuse) schema `schema` holding the tables of `sqlite_path`; commit.

    Raises MigrationError when the file cannot be read or PostgreSQL rejects a
    table or its rows (key problems are reported, not raised).
    """
    digest = hashlib.sha256(Path(sqlite_path).read_bytes()).hexdigest()
    exists, stamp = _stamp(conn, schema)
    if exists and not (stamp or "").startswith(_STAMP):
        # NOTE: never drop a schema someone else made: the DSN may point at a real server.
        raise MigrationError(
            f"schema {schema!r} exists and was not made by headstart's migration; "
            "use another database or a schema prefix (--pg-schema-prefix)"
        )
    if not force and stamp == _STAMP + digest:
        return MigrationReport(schema, digest, row_counts(conn, schema), foreign_keys(conn, schema), reused=True)
    tables, fks = _read_sqlite(sqlite_path)
    notes = _align_key_types(tables, fks)
    ident = pgsql.Identifier(schema)
    try:
        with conn.transaction():
            conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
            conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(ident))
            for table in tables.values():
                notes += _create_and_load(conn, schema, table)
            for table in tables.values():
                notes += _add_primary_key(conn, schema, table)
            for owner, declared in fks.items():
                for columns, ref_table, ref_columns in declared:
                    notes += _add_foreign_key(conn, schema, tables, owner, columns, ref_table, ref_columns)
            conn.execute(pgsql.SQL("COMMENT ON SCHEMA {} IS {}").format(ident, pgsql.Literal(_STAMP + digest)))
    except psycopg.Error as exc:
        raise MigrationError(f"migrating {sqlite_path} into schema {schema!r} failed: {exc}") from exc
    counts = row_counts(conn, schema)
    for table in tables.values():
        if counts.get(table.name) != len(table.rows):
            raise MigrationError(
                f"{schema}.{table.name}: {counts.get(table.name)} rows in PostgreSQL, {len(table.rows)} in SQLite"
            )
    return MigrationReport(schema, digest, counts, foreign_keys(conn, schema), notes)


def _stamp(conn: psycopg.Connection, schema: str) -> tuple[bool, str | None]:
    """(whether `schema` exists, its comment)."""
    row = conn.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s", (schema,)
    ).fetchone()
    conn.commit()
    return (row is not None, row[0] if row else None)


# A declared foreign key: (columns, referenced table, referenced columns or None for "its primary key").
_DeclaredKey = tuple[tuple[str, ...], str, tuple[str, ...] | None]


def _read_sqlite(path: Path) -> tuple[dict[str, _Table], dict[str, list[_DeclaredKey]]]:
    conn = connect_read_only(path)
    conn.set_authorizer(None)  # our own catalog reads (PRAGMA) are trusted
    try:
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid")]
        tables: dict[str, _Table] = {}
        fks: dict[str, list[_DeclaredKey]] = {}
        for name in names:
            quoted = '"' + name.replace('"', '""') + '"'
            info = conn.execute(f"PRAGMA table_info({quoted})").fetchall()
            rows = conn.execute(f"SELECT * FROM {quoted}").fetchall()
            columns = tuple(c[1].lower() for c in info)
            if len(set(columns)) != len(columns) or name.lower() in tables:
                raise MigrationError(f"{path}: names in {name!r} collide once lower-cased")
            types = tuple(choose_type(c[2], [r[i] for r in rows]) for i, c in enumerate(info))
            not_null = tuple(bool(c[3]) and all(r[i] is not None for r in rows) for i, c in enumerate(info))
            pk = tuple(c[1].lower() for c in sorted((c for c in info if c[5]), key=lambda c: c[5]))
            tables[name.lower()] = _Table(name.lower(), columns, types, not_null, pk, rows)
            grouped: dict[int, list] = defaultdict(list)
            for fk in conn.execute(f"PRAGMA foreign_key_list({quoted})"):
                grouped[fk[0]].append(fk)
            fks[name.lower()] = [
                (tuple(f[3].lower() for f in g), g[0][2].lower(), _referenced(g)) for _, g in sorted(grouped.items())
            ]
        return tables, fks
    except sqlite3.Error as exc:
        raise MigrationError(f"cannot read {path}: {exc}") from exc
    finally:
        conn.close()


def _align_key_types(tables: dict[str, _Table], fks: dict[str, list[_DeclaredKey]]) -> list[str]:
    """Retype a TEXT foreign-key column to its referenced INTEGER key when every value is a canonical integer.

    Spider declares some keys TEXT on one side and INTEGER on the other
    (car_makers.Country → countries.CountryId); SQLite compares them
    numerically, PostgreSQL refuses the foreign key. Keeping the key wins over
    keeping the declared TEXT when the values are '1', '2', ... (nothing is
    lost), and the change is reported.
    """
    notes = []
    for owner, declared in fks.items():
        for columns, ref_table, ref_columns in declared:
            ref = tables.get(ref_table)
            if ref is None:
                continue
            ref_columns = ref_columns or ref.primary_key
            for column, ref_column in zip(columns, ref_columns):
                table = tables[owner]
                if column not in table.columns or ref_column not in ref.columns:
                    continue
                i, j = table.columns.index(column), ref.columns.index(ref_column)
                mine, theirs = table.types[i], ref.types[j]
                values = [row[i] for row in table.rows if row[i] is not None]
                if mine.kind == "text" and theirs.kind == "integer" and all(_canonical_int(v) for v in values):
                    types = table.types[:i] + (theirs,) + table.types[i + 1:]
                    tables[owner] = replace(table, types=types)
                    notes.append(f"{owner}.{column}: declared {mine.pg_type}, stored as {theirs.pg_type} like "
                                 f"{ref_table}.{ref_column} so the foreign key can be declared (values are integers)")
    return notes


def _canonical_int(value: object) -> bool:
    return isinstance(value, str) and value.lstrip("-").isdigit() and str(int(value)) == value


def _referenced(rows: list[tuple]) -> tuple[str, ...] | None:
    """The referenced columns of one PRAGMA foreign_key_list group; None means the target's primary key."""
    return None if rows[0][4] is None else tuple(r[4].lower() for r in rows)


def _create_and_load(conn: psycopg.Connection, schema: str, table: _Table) -> list[str]:
    target = pgsql.Identifier(schema, table.name)
    column_defs = [
        pgsql.SQL("{} {}{}").format(
            pgsql.Identifier(col), pgsql.SQL(ctype.pg_type), pgsql.SQL(" NOT NULL" if nn else "")
        )
        for col, ctype, nn in zip(table.columns, table.types, table.not_null)
    ]
    conn.execute(pgsql.SQL("CREATE TABLE {} ({})").format(target, pgsql.SQL(", ").join(column_defs)))
    columns = pgsql.SQL(", ").join(map(pgsql.Identifier, table.columns))
    kinds = [t.kind for t in table.types]
    with conn.cursor().copy(pgsql.SQL("COPY {} ({}) FROM STDIN").format(target, columns)) as copy:
        for row in table.rows:
            copy.write_row([convert(v, k) for v, k in zip(row, kinds)])
    return [f"{table.name}.{col}: {t.note}" for col, t in zip(table.columns, table.types) if t.note]


def _add_primary_key(conn: psycopg.Connection, schema: str, table: _Table) -> list[str]:
    if not table.primary_key:
        return []
    statement = pgsql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(
        pgsql.Identifier(schema, table.name), pgsql.SQL(", ").join(map(pgsql.Identifier, table.primary_key)))
    error = _try(conn, statement)
    return [] if error is None else [f"{table.name}: primary key {table.primary_key} not added: {error}"]


def _add_foreign_key(conn, schema, tables, owner, columns, ref_table, ref_columns) -> list[str]:
    label = f"{owner}({', '.join(columns)}) -> {ref_table}"
    if ref_table not in tables:
        return [f"foreign key {label} skipped: table {ref_table!r} does not exist"]
    ref_columns = ref_columns or tables[ref_table].primary_key
    if not ref_columns or len(ref_columns) != len(columns):
        return [f"foreign key {label} skipped: cannot tell which columns it references"]
    label = f"{label}({', '.join(ref_columns)})"
    notes = []
    if tuple(ref_columns) != tables[ref_table].primary_key:
        unique = pgsql.SQL("ALTER TABLE {} ADD UNIQUE ({})").format(
            pgsql.Identifier(schema, ref_table), pgsql.SQL(", ").join(map(pgsql.Identifier, ref_columns)))
        error = _try(conn, unique)
        if error is not None and "already exists" not in error:
            return [f"foreign key {label} skipped: referenced columns are not unique ({error})"]
        if error is None:
            notes.append(f"{ref_table}({', '.join(ref_columns)}): UNIQUE added so {label} can be declared")
    statement = pgsql.SQL("ALTER TABLE {} ADD FOREIGN KEY ({}) REFERENCES {} ({})").format(
        pgsql.Identifier(schema, owner), pgsql.SQL(", ").join(map(pgsql.Identifier, columns)),
        pgsql.Identifier(schema, ref_table), pgsql.SQL(", ").join(map(pgsql.Identifier, ref_columns)))
    error = _try(conn, statement)
    if error is None:
        return notes
    if "violates foreign key" not in error:
        return notes + [f"foreign key {label} skipped: {error}"]
    error_nv = _try(conn, pgsql.SQL("{} NOT VALID").format(statement))
    if error_nv is not None:
        return notes + [f"foreign key {label} skipped: {error_nv}"]
    return notes + [f"foreign key {label} added NOT VALID: existing rows violate it ({error})"]


def _try(conn: psycopg.Connection, statement: pgsql.Composable) -> str | None:
    """Run `statement` in a savepoint; the error message, or None when it worked."""
    try:
        with conn.transaction():
            conn.execute(statement)
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0]
        detail = exc.diag.message_detail if getattr(exc, "diag", None) else None
        return f"{first} ({detail})" if detail else first
    return None
