"""Rows of a data session: validated against the table's columns and types,
rendered as one compact line each.

A row is a mapping column -> value for one table of the session's schema.
Validation is strict and names the problem (unknown table or column, a value
of the wrong type or out of range, a row too long): the edges map
`InvalidInput` to INVALID_ARGUMENT. Types follow SQLite's declared-type
affinity rules (the substring rules of
https://www.sqlite.org/datatype3.html section 3.1). Ranges are SQLite's
own: an integer is a signed 64-bit value (sqlite3 cannot even bind a larger
Python int: OverflowError, which is no sqlite3.Error, and it once froze a
session's ingestion for good: issue 29), a real is finite, and a text value
fits the row (a row's line is at most `max_chars` characters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from headstart.engine.errors import InvalidInput
from headstart.schema.model import Schema, SchemaError, Table

Scalar = int | float | str | None
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1  # SQLite's INTEGER: a signed 64-bit value


def affinity(declared: str) -> str:
    """SQLite's type affinity of a declared column type: INTEGER, TEXT, BLOB, REAL or NUMERIC."""
    t = declared.upper()
    if "INT" in t:
        return "INTEGER"
    if any(s in t for s in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in t or not t:
        return "BLOB"  # no declared type: any value is kept as given
    if any(s in t for s in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


@dataclass(frozen=True)
class DataRow:
    """A validated row: its table (schema spelling), its columns in table order, and its line."""

    table: str
    columns: tuple[str, ...]
    values: tuple[Scalar, ...]
    line: str


def _check_value(table: Table, column: str, declared: str, value: Any, max_chars: int) -> Scalar:
    where = f"{table.name}.{column}"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidInput(f"{where}: {type(value).__name__} values are not accepted (int, float, str or null)")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{where}: {value!r} is not a finite number")
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        # NOTE: whatever the column's affinity: SQLite stores no integer beyond 64 bits
        raise InvalidInput(f"{where}: {value} is outside SQLite's integer range (-2^63 .. 2^63-1)")
    if isinstance(value, str) and len(value) > max_chars:
        raise InvalidInput(f"{where}: text of {len(value)} characters; a row holds at most {max_chars}")
    kind = affinity(declared)
    if kind == "INTEGER" and not isinstance(value, int):
        raise InvalidInput(f"{where} is {declared}: {value!r} is not an integer")
    # dates and times have NUMERIC affinity but are written as text ('2026-11-24')
    temporal = kind == "NUMERIC" and any(s in declared.upper() for s in ("DATE", "TIME", "YEAR"))
    if kind in ("REAL", "NUMERIC") and isinstance(value, str) and not temporal:
        raise InvalidInput(f"{where} is {declared}: {value!r} is not a number")
    if kind == "TEXT" and not isinstance(value, str):
        raise InvalidInput(f"{where} is {declared}: {value!r} is not text")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInput(f"{where}: not valid Unicode (lone surrogate at {exc.start})") from exc
    return value


def render_value(value: Scalar) -> str:
    """SQL literal spelling: NULL, numbers as Python writes them, text in single quotes."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''").replace("\n", " ") + "'"
    return repr(value)


def validate_row(schema: Schema, table_name: Any, values: Any, max_chars: int) -> DataRow:
    """A `DataRow` for `values` (column -> value) of `table_name`, or InvalidInput naming the problem.

    Columns left out are NULL (a NOT NULL column left out is an error). The
    line is `table(v1, v2, ...)` in the table's column order: compact, and
    what an INSERT's VALUES would say.
    """
    if not isinstance(table_name, str):
        raise InvalidInput(f"a row's table must be a string, not {type(table_name).__name__}")
    try:
        table = schema.table(table_name)
    except SchemaError as exc:
        raise InvalidInput(str(exc)) from exc
    if not isinstance(values, Mapping) or not values:
        raise InvalidInput(f"a row of {table.name!r} must be a non-empty mapping of column to value")
    given = {}
    for name, value in values.items():
        if not isinstance(name, str):
            raise InvalidInput(f"{table.name}: column names must be strings, not {type(name).__name__}")
        try:
            column = table.column(name)
        except SchemaError as exc:
            raise InvalidInput(str(exc)) from exc
        if column.name in given:
            raise InvalidInput(f"{table.name}.{column.name} is given twice")
        given[column.name] = _check_value(table, column.name, column.type, value, max_chars)
    for column in table.columns:
        if column.not_null and given.get(column.name) is None and column.name not in table.primary_key:
            raise InvalidInput(f"{table.name}.{column.name} is NOT NULL and has no value")
    cols = tuple(c.name for c in table.columns)  # every column, in order: the line needs no names
    vals = tuple(given.get(c) for c in cols)
    line = f"{table.name}({', '.join(render_value(v) for v in vals)})"
    if len(line) > max_chars:
        raise InvalidInput(f"a row of {table.name!r} renders to {len(line)} characters; the limit is {max_chars}")
    return DataRow(table.name, cols, vals, line)
