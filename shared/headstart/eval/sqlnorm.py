"""Parse SQLite-flavoured SQL with sqlglot and normalise it (for exact match and porting).

Spider's SQL is written for SQLite, where `"France"` is a string literal when no
column of that name is in scope (SQLite's double-quote fallback), identifiers
are case-insensitive, and LIKE ignores ASCII case. `parse_sqlite` resolves the
first with the database's names, so the tree means what SQLite would run;
`executors.pg_dialect` ports such a tree to PostgreSQL.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

_SIMPLE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def database_names(db_path: Path) -> frozenset[str]:
    """Lower-cased table and column names of a SQLite file (opened read-only)."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        names: set[str] = set()
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
        for table in tables:
            names.add(table.lower())
            escaped = table.replace('"', '""')
            names.update(r[1].lower() for r in conn.execute(f'PRAGMA table_info("{escaped}")'))
        return frozenset(names)
    finally:
        conn.close()


def parse_sqlite(sql: str, known_names: frozenset[str] | None) -> exp.Expression:
    """Parse `sql` as SQLite; quoted bare names that name nothing become string literals.

    With `known_names` None the double-quote fallback is not applied. Raises
    sqlglot's ParseError (a SqlglotError) when sqlglot cannot parse `sql`.
    """
    tree = sqlglot.parse_one(sql, read="sqlite")
    if known_names is None:
        return tree
    in_scope = set(known_names) | _aliases(tree)
    for column in list(tree.find_all(exp.Column)):
        ident = column.this
        if (
            isinstance(ident, exp.Identifier)
            and ident.quoted
            and not column.table
            and ident.this.lower() not in in_scope
        ):
            column.replace(exp.Literal.string(ident.this))
    return tree


def normalize_sql(sql: str, known_names: frozenset[str] | None = None) -> str:
    """A canonical spelling of `sql` for exact match: case, quotes, spacing, aliases' AS.

    Falls back to a lower-cased, whitespace-collapsed string when sqlglot
    cannot parse `sql`.
    """
    try:
        tree = parse_sqlite(sql.strip().rstrip(";"), known_names)
    except SqlglotError:
        return " ".join(sql.strip().rstrip(";").lower().split())
    for ident in tree.find_all(exp.Identifier):
        name = ident.this.lower()
        ident.set("this", name)
        ident.set("quoted", not _SIMPLE_NAME.match(name))
    return tree.sql(dialect="sqlite", normalize_functions="lower")


def _aliases(tree: exp.Expression) -> set[str]:
    names = set()
    for node in tree.find_all(exp.Alias, exp.TableAlias, exp.CTE):
        alias = node.alias if not isinstance(node, exp.TableAlias) else node.name
        if alias:
            names.add(alias.lower())
    return names
