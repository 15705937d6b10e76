"""Port SQLite-flavoured SQL to PostgreSQL for a database migrated by `pg_migrate`."""

from __future__ import annotations

from sqlglot import exp
from sqlglot.errors import SqlglotError

from headstart.eval.executors.pg_compat import apply_sqlite_semantics
from headstart.eval.sqlnorm import parse_sqlite


def to_postgres(sql: str, known_names: frozenset[str], schema: dict[str, dict[str, str]] | None = None) -> str:
    """`sql` (SQLite) rewritten for PostgreSQL.

    Identifiers are lower-cased (the migration creates lower-case names),
    double-quoted strings become literals, SQLite's typing is emulated where
    `schema` ({table: {column: sqlglot type}}) is given (pg_compat), and LIKE
    becomes ILIKE (SQLite's LIKE ignores ASCII case). Returns `sql` unchanged
    when sqlglot cannot parse it, so that PostgreSQL reports the error.
    """
    try:
        tree = parse_sqlite(sql, known_names)
        for ident in tree.find_all(exp.Identifier):
            ident.set("this", ident.this.lower())
        if schema:
            tree = apply_sqlite_semantics(tree, schema)
        for like in list(tree.find_all(exp.Like)):
            like.replace(exp.ILike(this=like.this, expression=like.expression))
        return tree.sql(dialect="postgres")
    except SqlglotError:
        return sql
