"""Map a SQLite column (declared type + actual values) to a PostgreSQL type.

SQLite stores any value in any column; PostgreSQL does not. The declared type
is kept whenever every value fits it (INTEGER → integer/bigint, VARCHAR(n) →
varchar(n), DECIMAL(p,s) → numeric(p,s), DATETIME → timestamp, BOOL →
boolean for T/F/0/1 values); otherwise the column falls back to the widest
type the values allow, and the fallback is reported. CHAR(n) becomes
varchar(n): PostgreSQL's blank padding would change the values returned.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Sequence

_LENGTH = re.compile(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")
_BOOL_VALUES = {0: False, 1: True, "0": False, "1": True, "t": True, "f": False, "true": True, "false": False,
                "y": True, "n": False, "yes": True, "no": False}
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1


@dataclass(frozen=True)
class ColumnType:
    """The PostgreSQL type chosen for one column, and why when it differs from the declaration."""

    pg_type: str
    kind: str  # integer | float | numeric | text | boolean | timestamp | bytes
    note: str = ""


def choose_type(declared: str, values: Sequence[Any]) -> ColumnType:
    """The type for a column declared `declared` holding `values` (NULLs included)."""
    decl = declared.lower().strip()
    present = [v for v in values if v is not None]
    wanted = _declared_kind(decl)
    fitted = _fit(wanted, decl, present)
    if fitted is not None:
        return fitted
    inferred = _infer(present)
    note = f"declared {declared or '(none)'} but holds values that do not fit; stored as {inferred.pg_type}"
    return ColumnType(inferred.pg_type, inferred.kind, note if decl else "")


def convert(value: Any, kind: str) -> Any:
    """A SQLite value as the Python value psycopg writes for a column of `kind`."""
    if value is None:
        return None
    if kind == "boolean":
        return _BOOL_VALUES[value.lower() if isinstance(value, str) else value]
    if kind == "timestamp":
        return dt.datetime.fromisoformat(value)
    if kind == "integer" and isinstance(value, str):
        return int(value)  # a TEXT key retyped to its INTEGER target (pg_migrate)
    if kind == "numeric":
        return Decimal(str(value))
    if kind == "text":
        text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
        return text.replace("\x00", "")  # PostgreSQL text cannot hold NUL
    return value


def _declared_kind(decl: str) -> str:
    # SQLite's affinity rules, in SQLite's order, plus the names Spider uses.
    if "int" in decl:
        return "integer"
    if decl.startswith("bool"):
        return "boolean"
    if any(word in decl for word in ("char", "clob", "text")):
        return "text"
    if "blob" in decl:
        return "bytes"
    if any(word in decl for word in ("real", "floa", "doub")):
        return "float"
    if any(word in decl for word in ("dec", "num")):
        return "numeric"
    if any(word in decl for word in ("date", "time")):
        return "timestamp"
    return "infer"


def _fit(kind: str, decl: str, values: list[Any]) -> ColumnType | None:
    length = _LENGTH.search(decl)
    if kind == "integer" and all(isinstance(v, int) for v in values):
        big = any(abs(v) > _INT32 for v in values)
        if any(abs(v) > _INT64 for v in values):
            return None
        return ColumnType("bigint" if big or "big" in decl else "integer", "integer")
    if kind == "text" and all(isinstance(v, str) for v in values):
        if length and all(len(v) <= int(length.group(1)) for v in values):
            return ColumnType(f"varchar({length.group(1)})", "text")
        return ColumnType("text", "text")
    if kind == "float" and all(isinstance(v, (int, float)) for v in values):
        return ColumnType("double precision", "float")
    if kind == "numeric" and all(isinstance(v, (int, float)) for v in values):
        if length and length.group(2):
            precision, scale = int(length.group(1)), int(length.group(2))
            if all(_fits_numeric(v, precision, scale) for v in values):
                return ColumnType(f"numeric({precision},{scale})", "numeric")
        return ColumnType("numeric", "numeric")
    if kind == "boolean" and all(_is_bool(v) for v in values):
        return ColumnType("boolean", "boolean")
    if kind == "timestamp" and all(_is_timestamp(v) for v in values):
        return ColumnType("timestamp", "timestamp")
    if kind == "bytes" and all(isinstance(v, bytes) for v in values):
        return ColumnType("bytea", "bytes")
    return None


def _infer(values: list[Any]) -> ColumnType:
    if values and all(isinstance(v, int) for v in values) and all(abs(v) <= _INT64 for v in values):
        return ColumnType("bigint", "integer")
    if values and all(isinstance(v, (int, float)) for v in values):
        return ColumnType("double precision", "float")
    if values and all(isinstance(v, bytes) for v in values):
        return ColumnType("bytea", "bytes")
    return ColumnType("text", "text")


def _is_bool(value: Any) -> bool:
    key = value.lower() if isinstance(value, str) else value
    return not isinstance(value, float) and key in _BOOL_VALUES


def _is_timestamp(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        dt.datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _fits_numeric(value: float | int, precision: int, scale: int) -> bool:
    try:
        exact = Decimal(str(value))
        rounded = exact.quantize(Decimal(1).scaleb(-scale))
    except InvalidOperation:
        return False
    digits = len(rounded.as_tuple().digits)
    return rounded == exact and digits <= precision
