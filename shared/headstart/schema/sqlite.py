"""Load a `Schema` from a SQLite database file, opened read-only.

Called by `resolve_database` for `.sqlite` / `.db` paths and by tools that
need the schema of a file that is not in a Spider `tables.json`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from headstart.schema.model import Column, ForeignKey, Schema, SchemaError, Table

_TABLES_SQL = (
    "SELECT name FROM sqlite_master WHERE type = 'table' "
    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid"
)
# table_xinfo (unlike table_info) also lists generated columns; hidden == 1
# marks the hidden columns of virtual tables, which are not user columns.
_COLUMNS_SQL = 'SELECT name, type, "notnull", pk, hidden FROM pragma_table_xinfo(?) ORDER BY cid'
_FOREIGN_KEYS_SQL = 'SELECT id, seq, "table", "from", "to" FROM pragma_foreign_key_list(?)'

# (referenced table, from columns, to columns); a `to` entry is None where the
# declaration omitted the referenced columns (they are then the referenced PK).
_RawForeignKey = tuple[str, list[str], list[str | None]]


def load_sqlite_schema(path: str | Path, db_id: str | None = None) -> Schema:
    """Read tables, columns, primary and foreign keys of the SQLite file at `path`.

    The file is opened with a read-only URI, so a missing file is never
    created. Tables whose name starts with `sqlite_` (SQLite's own) are left
    out. Foreign keys that cannot be resolved (referenced table missing, or
    referenced columns omitted while that table has no primary key) are not
    put on the tables: they are listed in `schema.extras["skipped_foreign_keys"]`.

    Args:
        path: the database file.
        db_id: the schema's name; defaults to the file name without suffix.

    Raises:
        SchemaError: the file is missing, unreadable, not a SQLite database,
            or holds no tables. The message names the path.
    """
    path = Path(path)
    if not path.is_file():
        raise SchemaError(f"SQLite database {str(path)!r} does not exist or is not a file")
    uri = path.resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise SchemaError(f"cannot open SQLite database {str(path)!r}: {exc}") from exc
    try:
        raw_tables = _read_tables(conn)
    except sqlite3.Error as exc:
        raise SchemaError(f"cannot read SQLite database {str(path)!r}: {exc}") from exc
    finally:
        conn.close()
    if not raw_tables:
        raise SchemaError(f"SQLite database {str(path)!r} has no tables")
    tables, skipped = _link_foreign_keys(raw_tables)
    extras = {"skipped_foreign_keys": skipped} if skipped else {}
    return Schema(db_id or path.stem, tables, source=str(path), extras=extras)


def _read_tables(conn: sqlite3.Connection) -> list[tuple[Table, list[_RawForeignKey]]]:
    """Each table, in creation order and without foreign keys yet, with its raw foreign keys."""
    result = []
    for (name,) in conn.execute(_TABLES_SQL).fetchall():
        columns, pk_positions = [], []
        for col_name, col_type, not_null, pk, hidden in conn.execute(_COLUMNS_SQL, (name,)):
            if hidden == 1:
                continue
            columns.append(Column(col_name, col_type or "", bool(not_null)))
            if pk:
                pk_positions.append((pk, col_name))
        primary_key = tuple(col for _, col in sorted(pk_positions))
        result.append((Table(name, tuple(columns), primary_key), _read_foreign_keys(conn, name)))
    return result


def _read_foreign_keys(conn: sqlite3.Connection, table: str) -> list[_RawForeignKey]:
    grouped: dict[int, list[tuple[int, str, str, str | None]]] = {}
    for fk_id, seq, ref_table, from_col, to_col in conn.execute(_FOREIGN_KEYS_SQL, (table,)):
        grouped.setdefault(fk_id, []).append((seq, ref_table, from_col, to_col))
    raw = []
    # NOTE: ascending ids are the reverse of declaration order (the last
    # declared key has id 0). We keep the pragma's order on purpose: Spider's
    # and BIRD's tables.json list foreign keys in this order, so a database
    # renders the same whether loaded from its file or from tables.json.
    for fk_id in sorted(grouped):
        rows = sorted(grouped[fk_id])
        key = (rows[0][1], [r[2] for r in rows], [r[3] for r in rows])
        if key not in raw:  # a key declared twice (Spider's dog_kennels) is one key
            raw.append(key)
    return raw


def _link_foreign_keys(
    raw_tables: list[tuple[Table, list[_RawForeignKey]]],
) -> tuple[tuple[Table, ...], list[str]]:
    """Attach foreign keys, spelled with the referenced table's own names."""
    by_name = {table.name.lower(): table for table, _ in raw_tables}
    tables, skipped = [], []
    for table, raw_fks in raw_tables:
        fks = []
        for ref_name, from_cols, to_cols in raw_fks:
            label = f"{table.name}({', '.join(from_cols)}) -> {ref_name}"
            ref = by_name.get(ref_name.lower())
            if ref is None:
                skipped.append(f"{label}: table {ref_name!r} does not exist")
                continue
            if any(col is None for col in to_cols):
                if len(ref.primary_key) != len(from_cols):
                    skipped.append(
                        f"{label}: referenced columns omitted and {ref.name!r} has "
                        f"{len(ref.primary_key)} primary-key column(s) for {len(from_cols)}"
                    )
                    continue
                to_cols = list(ref.primary_key)
            fks.append(
                ForeignKey(
                    tuple(_own_spelling(table, c) for c in from_cols),
                    ref.name,
                    tuple(_own_spelling(ref, c) for c in to_cols),
                )
            )
        tables.append(Table(table.name, table.columns, table.primary_key, tuple(fks)))
    return tuple(tables), skipped


def _own_spelling(table: Table, column: str) -> str:
    """The column's name as declared in `table` (SQLite names are case-insensitive)."""
    try:
        return table.column(column).name
    except SchemaError:
        return column
