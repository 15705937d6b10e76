"""SQLite files of the test catalogue root (tests/serve_fixture.py): small, built per test session."""

from __future__ import annotations

import sqlite3
from pathlib import Path

BLOB_ROWS = 30


def make_tenant_dbs(root: Path) -> Path:
    """`root/blobs.sqlite`: table t(id, name) of BLOB_ROWS rows, for Run limits and catalogue tests."""
    root.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(root / "blobs.sqlite") as conn:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"row {i}") for i in range(BLOB_ROWS)])
    conn.close()
    (root / "not_a_db.sqlite").write_text("this is not a database")  # registered, but does not load
    return root
