"""Load a `Schema` from one schema (namespace) of a live PostgreSQL database.

Reads pg_catalog in a read-only session with psycopg 3. The DSN's password
never appears in `Schema.source` or in an error message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headstart.schema.dsn import redact_dsn, scrub_password
from headstart.schema.model import Column, ForeignKey, Schema, SchemaError, Table

if TYPE_CHECKING:
    import psycopg

# Ordinary, partitioned and foreign tables; partitions are reached through
# their parent, so they are not tables of their own here.
_TABLES_SQL = """
SELECT c.oid, c.relname::text
FROM pg_class c
WHERE c.relnamespace = %(ns)s AND c.relkind IN ('r', 'p', 'f') AND NOT c.relispartition
ORDER BY c.relname COLLATE "C"
"""

_COLUMNS_SQL = """
SELECT a.attrelid, a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute a
WHERE a.attrelid = ANY(%(oids)s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""

# Key columns in key order. conparentid = 0 leaves out the copies PostgreSQL
# makes of a foreign key for each partition of a referenced partitioned table.
_CONSTRAINTS_SQL = """
SELECT con.conrelid, con.contype::text, con.conname::text,
       ARRAY(SELECT a.attname::text
             FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
             ORDER BY k.ord),
       ref.relname::text, ref_ns.nspname::text,
       ARRAY(SELECT a.attname::text
             FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum
             ORDER BY k.ord)
FROM pg_constraint con
LEFT JOIN pg_class ref ON ref.oid = con.confrelid
LEFT JOIN pg_namespace ref_ns ON ref_ns.oid = ref.relnamespace
WHERE con.conrelid = ANY(%(oids)s) AND con.contype IN ('p', 'f') AND con.conparentid = 0
ORDER BY con.conrelid, con.conname COLLATE "C"
"""


def load_postgres_schema(
    dsn: str,
    schema_name: str = "public",
    db_id: str | None = None,
    connect_timeout: int = 10,
) -> Schema:
    """Read the tables of `schema_name` in the database at `dsn`.

    Tables are in name order (byte order, so the same on every server and
    after a dump/restore), columns in declared order with `format_type`
    types, keys in key order. A foreign key to a table in another schema is
    not put on its table: it is listed in `schema.extras["skipped_foreign_keys"]`.

    Args:
        dsn: a libpq connection string or `postgresql://` URI.
        schema_name: the namespace to read.
        db_id: the schema's name; defaults to the database name, followed by
            `.schema_name` when that is not `public`.
        connect_timeout: seconds to wait for the server.

    Raises:
        SchemaError: the server cannot be reached or queried, the schema does
            not exist or has no tables. Messages carry the redacted DSN.
    """
    import psycopg  # here, not at import: 9 MiB in every replica that serves only SQLite (docs/benchmarks.md, "Replica RSS")

    shown = redact_dsn(dsn)
    try:
        with psycopg.connect(dsn, connect_timeout=connect_timeout) as conn:
            conn.read_only = True  # the catalog reads run in one READ ONLY transaction
            dbname, tables, skipped = _read(conn, schema_name)
    except psycopg.Error as exc:
        detail = scrub_password(str(exc).strip(), dsn)
        raise SchemaError(
            f"cannot read PostgreSQL schema {schema_name!r} at {shown}: {detail}"
        ) from exc
    except _MissingSchema:
        raise SchemaError(f"PostgreSQL schema {schema_name!r} does not exist at {shown}") from None
    if not tables:
        raise SchemaError(f"PostgreSQL schema {schema_name!r} at {shown} has no tables")
    name = db_id or (dbname if schema_name == "public" else f"{dbname}.{schema_name}")
    extras = {"skipped_foreign_keys": skipped} if skipped else {}
    return Schema(name, tables, source=shown, extras=extras)


class _MissingSchema(Exception):
    """Raised inside the connection block so it closes before the SchemaError."""


def _read(conn: "psycopg.Connection", schema_name: str) -> tuple[str, tuple[Table, ...], list[str]]:
    row = conn.execute(
        "SELECT current_database()::text, (SELECT oid FROM pg_namespace WHERE nspname = %s)",
        (schema_name,),
    ).fetchone()
    dbname, ns_oid = row
    if ns_oid is None:
        raise _MissingSchema
    table_rows = conn.execute(_TABLES_SQL, {"ns": ns_oid}).fetchall()
    oids = [oid for oid, _ in table_rows]
    columns: dict[int, list[Column]] = {oid: [] for oid in oids}
    for oid, name, col_type, not_null in conn.execute(_COLUMNS_SQL, {"oids": oids}):
        columns[oid].append(Column(name, col_type, bool(not_null)))
    primary: dict[int, tuple[str, ...]] = {}
    foreign: dict[int, list[ForeignKey]] = {}
    skipped = []
    names = {oid: name for oid, name in table_rows}
    for oid, kind, con_name, cols, ref_table, ref_schema, ref_cols in conn.execute(
        _CONSTRAINTS_SQL, {"oids": oids}
    ):
        if kind == "p":
            primary[oid] = tuple(cols)
        elif ref_schema != schema_name:
            skipped.append(
                f"{names[oid]}({', '.join(cols)}) -> {ref_schema}.{ref_table}: "
                f"constraint {con_name!r} references another schema"
            )
        else:
            foreign.setdefault(oid, []).append(ForeignKey(tuple(cols), ref_table, tuple(ref_cols)))
    tables = tuple(
        Table(name, tuple(columns[oid]), primary.get(oid, ()), tuple(foreign.get(oid, ())))
        for oid, name in table_rows
    )
    return dbname, tables, skipped
