"""Render a `Schema` as CREATE TABLE statements for prompts.

The output is deterministic (it is part of prompts and of table-cache keys)
and table-local: `render_create_tables(schema)` is exactly the tables
rendered one by one by `render_table`, joined by `TABLE_SEPARATOR`, so the
table cache can encode one table at a time and still match a whole prompt.

    CREATE TABLE countrylanguage (
      CountryCode char(3) NOT NULL,
      Language char(30) NOT NULL,
      PRIMARY KEY (CountryCode, Language),
      FOREIGN KEY (CountryCode) REFERENCES country(Code)
    );
"""

from __future__ import annotations

import re

from headstart.schema.keywords import SQL_KEYWORDS
from headstart.schema.model import Column, ForeignKey, Schema, Table

TABLE_SEPARATOR = "\n\n"
INDENT = "  "

_PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def quote_identifier(name: str) -> str:
    """`name` as is when it is a plain identifier and no SQL keyword, else double-quoted.

    Embedded double quotes are doubled, as SQL requires.
    """
    if _PLAIN_IDENTIFIER.fullmatch(name) and name.upper() not in SQL_KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def render_create_tables(schema: Schema) -> str:
    """All tables of `schema`, in schema order, joined by `TABLE_SEPARATOR`."""
    return TABLE_SEPARATOR.join(render_table(table) for table in schema.tables)


def render_table(table: Table) -> str:
    """One CREATE TABLE statement: columns, then PRIMARY KEY, then FOREIGN KEYs in order."""
    lines = [_render_column(col) for col in table.columns]
    if table.primary_key:
        lines.append(f"PRIMARY KEY ({_column_list(table.primary_key)})")
    lines.extend(_render_foreign_key(fk) for fk in table.foreign_keys)
    name = quote_identifier(table.name)
    if not lines:  # PostgreSQL allows tables without columns
        return f"CREATE TABLE {name} ();"
    body = ",\n".join(INDENT + line for line in lines)
    return f"CREATE TABLE {name} (\n{body}\n);"


def _render_column(col: Column) -> str:
    # Declared types may hold runs of whitespace or newlines; one space each.
    parts = [quote_identifier(col.name), " ".join(col.type.split())]
    if col.not_null:
        parts.append("NOT NULL")
    return " ".join(part for part in parts if part)


def _render_foreign_key(fk: ForeignKey) -> str:
    return (
        f"FOREIGN KEY ({_column_list(fk.columns)}) "
        f"REFERENCES {quote_identifier(fk.ref_table)}({_column_list(fk.ref_columns)})"
    )


def _column_list(names: tuple[str, ...]) -> str:
    return ", ".join(quote_identifier(name) for name in names)
