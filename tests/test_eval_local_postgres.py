"""LocalPostgres: the throw-away server `headstart eval --executor postgres` starts when no DSN is set."""

from __future__ import annotations

import psycopg
import pytest

from headstart.eval.errors import LocalPostgresError
from headstart.eval.local_postgres import LocalPostgres, find_pg_bin


def test_starts_answers_and_cleans_up() -> None:
    try:
        find_pg_bin()
    except LocalPostgresError as exc:
        pytest.skip(str(exc))
    with LocalPostgres() as pg:
        root = pg.root
        with psycopg.connect(pg.dsn) as conn:
            assert int(conn.execute("SHOW server_version_num").fetchone()[0]) >= 150000
            assert conn.execute("SHOW lc_collate").fetchone()[0] == "C"
    assert pg.port is None and not root.exists()
    with pytest.raises(LocalPostgresError, match="not running"):
        _ = pg.dsn


def test_missing_binaries_are_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("HEADSTART_PG_BIN", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("glob.glob", lambda pattern: [])
    with pytest.raises(LocalPostgresError, match="initdb, pg_ctl.*not found"):
        find_pg_bin()
