"""The databases a gateway offers (its catalogue) and a read-only, bounded Run for the page.

A client names a catalogue entry, never a path: `run_read_only` gets the
entry's file from the catalogue. What a Run may cost is bounded on every
axis a tenant controls: time (a deadline), rows, bytes per cell, bytes in
all, and the largest value SQLite may build (`zeroblob(9e6)` fails in SQLite
instead of landing in the gateway's memory).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from headstart.client.errors import ApiError
from headstart.schema.catalogue import Catalogue, CatalogueEntry, UnknownDatabase

TRUNCATED_MARK = "…"
PROGRESS_EVERY = 200_000  # SQLite VM steps between deadline checks (about a millisecond)
MAX_RESULT_COLUMNS = 64  # SQLite's default allows 2000 columns of a Run's row


@dataclass(frozen=True)
class DatabaseInfo:
    id: str
    num_tables: int
    can_execute: bool


@dataclass(frozen=True)
class RunLimits:
    rows: int
    cell_bytes: int
    total_bytes: int
    value_bytes: int
    timeout_s: float


def list_catalogue(catalogue: Catalogue) -> list[DatabaseInfo]:
    """Every catalogue entry by name, but for a Spider id whose database file is not there (Spider's
    tables.json lists wta_1, whose file is not shipped: its SQL could never be run or checked); table counts
    for Spider ids (others: 0, not loaded here)."""
    from headstart.schema.spider_json import load_spider_tables

    tables_json = catalogue.spider_dir / "tables.json"
    spider = load_spider_tables(tables_json) if catalogue.include_spider and tables_json.is_file() else {}
    out = []
    for entry in catalogue.entries():
        if entry.kind == "spider":
            path = catalogue.spider_dir / "database" / entry.name / f"{entry.name}.sqlite"
            if path.is_file():
                out.append(DatabaseInfo(entry.name, len(spider[entry.name].tables) if entry.name in spider else 0,
                                        True))
        else:
            out.append(DatabaseInfo(entry.name, 0, entry.kind == "sqlite"))
    return out


def lookup(catalogue: Catalogue, db: object) -> CatalogueEntry:
    """The catalogue entry of `db`; ApiError(NOT_FOUND, "unknown database ...") otherwise."""
    try:
        return catalogue.entry(db)
    except UnknownDatabase as exc:
        raise ApiError("NOT_FOUND", str(exc)) from None


def sqlite_file(catalogue: Catalogue, entry: CatalogueEntry) -> Path:
    """The SQLite file a Run of `entry` reads (ApiError when it has none)."""
    if entry.kind == "sqlite":
        return Path(entry.spec)
    if entry.kind == "spider":
        path = catalogue.spider_dir / "database" / entry.name / f"{entry.name}.sqlite"
        if path.is_file():
            return path
    raise ApiError("INVALID_ARGUMENT", f"database {entry.name!r} cannot be Run from the page")


def run_read_only(path: Path, sql: str, limits: RunLimits) -> dict:
    """The first rows of `sql` on a SQLite file, read-only and contained.

    Returns `{"columns", "rows", "truncated"}`; `truncated` is true when a
    cell was cut (it ends with TRUNCATED_MARK) or rows were left out for the
    byte budget.

    Raises:
        ApiError: INVALID_ARGUMENT (not read-only, the SQL failed, a value over
            `value_bytes`), CANCELLED when the deadline passed.
    """
    from headstart.eval.executors.base import precheck
    from headstart.eval.executors.sqlite import connect_read_only

    rejected = precheck(sql)
    if rejected is not None:
        raise ApiError("INVALID_ARGUMENT", rejected.error or "not a read-only query")
    conn = connect_read_only(path)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.value_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_RESULT_COLUMNS)
    deadline = time.monotonic() + limits.timeout_s
    # NOTE: a coarse progress handler: each call takes the GIL from the event loop.
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_EVERY)
    rows, total, truncated = [], 0, False
    try:
        cursor = conn.execute(sql)
        columns = [d[0] for d in cursor.description or ()]
        while len(rows) < limits.rows:
            row = cursor.fetchone()  # one row at a time: at most one row's values in memory
            if row is None:
                break
            cut = [_cell(v, limits.cell_bytes) for v in row]
            cells = [c for c, _ in cut]
            truncated = truncated or any(was_cut for _, was_cut in cut)
            size = sum(len(c.encode()) if isinstance(c, str) else 8 for c in cells)
            if rows and total + size > limits.total_bytes:
                truncated = True
                break
            rows.append(cells)
            total += size
            if total > limits.total_bytes:
                truncated = True
                break
    except sqlite3.OperationalError as exc:
        if time.monotonic() > deadline:
            raise ApiError("CANCELLED", f"the query ran past its {limits.timeout_s:g} s deadline") from None
        raise ApiError("INVALID_ARGUMENT", f"{type(exc).__name__}: {exc}") from exc
    except (sqlite3.Error, sqlite3.Warning) as exc:
        raise ApiError("INVALID_ARGUMENT", f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    return {"columns": columns, "rows": rows, "truncated": truncated}


def _cell(value, cell_bytes: int) -> tuple[object, bool]:
    """A JSON-able cell of at most `cell_bytes` UTF-8 bytes (blobs as hex), and whether it was cut."""
    if isinstance(value, bytes):
        if len(value) > cell_bytes // 2:
            return value[: cell_bytes // 2].hex() + TRUNCATED_MARK, True
        return value.hex(), False
    if isinstance(value, str) and len(value.encode()) > cell_bytes:
        return value.encode()[:cell_bytes].decode("utf-8", "ignore") + TRUNCATED_MARK, True
    return value, False
