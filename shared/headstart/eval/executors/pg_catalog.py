"""Read back what a PostgreSQL schema holds: row counts and foreign keys."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql as pgsql


@dataclass(frozen=True, order=True)
class ForeignKeyInfo:
    """`table(columns)` references `ref_table(ref_columns)`; `validated` is False for NOT VALID."""

    table: str
    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]
    validated: bool = True


_FOREIGN_KEYS = """
SELECT cl.relname, rf.relname, c.convalidated,
       ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY AS k(num, pos)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.num ORDER BY k.pos)::text[],
       ARRAY(SELECT a.attname FROM unnest(c.confkey) WITH ORDINALITY AS k(num, pos)
             JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.num ORDER BY k.pos)::text[]
FROM pg_constraint c
JOIN pg_class cl ON cl.oid = c.conrelid
JOIN pg_namespace ns ON ns.oid = cl.relnamespace
JOIN pg_class rf ON rf.oid = c.confrelid
WHERE c.contype = 'f' AND ns.nspname = %s
"""


def foreign_keys(conn: psycopg.Connection, schema: str) -> list[ForeignKeyInfo]:
    """Every foreign key declared in `schema`, sorted."""
    rows = conn.execute(_FOREIGN_KEYS, (schema,)).fetchall()
    conn.commit()
    return sorted(ForeignKeyInfo(t, tuple(cols), rt, tuple(rcols), bool(valid)) for t, rt, valid, cols, rcols in rows)


def row_counts(conn: psycopg.Connection, schema: str) -> dict[str, int]:
    """Rows per table of `schema` (exact counts)."""
    tables = [r[0] for r in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", (schema,))]
    counts = {}
    for table in tables:
        query = pgsql.SQL("SELECT count(*) FROM {}").format(pgsql.Identifier(schema, table))
        counts[table] = conn.execute(query).fetchone()[0]
    conn.commit()
    return counts


def column_types(conn: psycopg.Connection, schema: str) -> dict[str, dict[str, str]]:
    """{table: {column: type}} of `schema`, types as PostgreSQL spells them (format_type)."""
    rows = conn.execute(
        """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY c.relname, a.attnum""",
        (schema,),
    ).fetchall()
    conn.commit()
    out: dict[str, dict[str, str]] = {}
    for table, column, pg_type in rows:
        out.setdefault(table, {})[column] = pg_type
    return out
