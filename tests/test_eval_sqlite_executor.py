"""The SQLite executor contains what a predicted query may try: writes, ATTACH, runaway joins."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from headstart.eval.errors import ConfigError, ExecutorError
from headstart.eval.executors import ExecLimits, build_executor
from headstart.eval.executors.sqlite import SqliteExecutor, connect_read_only
from headstart.paths import default_spider_dir

WORLD = default_spider_dir() / "database" / "world_1" / "world_1.sqlite"
pytestmark = pytest.mark.skipif(not WORLD.is_file(), reason=f"Spider data not found at {WORLD}")

CROSS_JOIN_1E9 = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) "
    "SELECT count(*) FROM n AS a, n AS b, n AS c"
)


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """A private copy of world_1, so a containment failure could not hurt the shared file."""
    copy = tmp_path / "world_1.sqlite"
    shutil.copyfile(WORLD, copy)
    return copy


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("SELECT count(*) FROM city", None),
        ("DROP TABLE city", "denied"),
        ("DELETE FROM city", "denied"),
        ("UPDATE city SET Population = 0", "denied"),
        ("INSERT INTO city (ID) VALUES (999999)", "denied"),
        ("CREATE TABLE evil (x)", "denied"),
        ("ATTACH DATABASE '/tmp/headstart-evil.db' AS evil", "denied"),
        ("DETACH DATABASE main", "denied"),
        ("PRAGMA writable_schema = ON", "denied"),
        ("VACUUM", "denied"),
        ("BEGIN", "denied"),
        ("SELECT load_extension('/tmp/evil.so')", "denied"),
        ("SELECT 1; DROP TABLE city", "multiple_statements"),
        ("", "empty_sql"),
        ("SELECT * FROM no_such_table", "sql_error"),
        ("SELECT length(zeroblob(1000000000))", "sql_error"),
    ],
)
def test_dangerous_queries_are_contained(world: Path, sql: str, code: str | None) -> None:
    before = sha256(world)
    executor = SqliteExecutor(ExecLimits(timeout_s=2.0))
    outcome = executor.execute("world_1", world, sql)
    executor.close()
    assert outcome.error_code == code
    assert sha256(world) == before
    assert not Path("/tmp/headstart-evil.db").exists()


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE city",
        "ATTACH DATABASE '/tmp/headstart-evil.db' AS evil",
        "INSERT INTO city (ID) VALUES (999999)",
        "PRAGMA query_only = OFF",
    ],
)
def test_the_connection_itself_refuses_writes(world: Path, sql: str) -> None:
    """Below the precheck: the authorizer and the read-only open stop the statement on their own."""
    conn = connect_read_only(world)
    with pytest.raises(sqlite3.DatabaseError, match="not authorized|authorization denied"):
        conn.execute(sql)
    conn.close()


def test_read_only_open_refuses_writes_even_without_authorizer(world: Path) -> None:
    conn = connect_read_only(world)
    conn.set_authorizer(None)
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
        conn.execute("DELETE FROM city")
    conn.close()


@pytest.mark.parametrize(
    "sql",
    [CROSS_JOIN_1E9, "SELECT count(*) FROM city AS a, city AS b, city AS c"],
    ids=["recursive-1e9", "city-cubed"],
)
def test_huge_cross_join_hits_the_timeout(world: Path, sql: str) -> None:
    executor = SqliteExecutor(ExecLimits(timeout_s=0.5))
    started = time.monotonic()
    outcome = executor.execute("world_1", world, sql)
    elapsed = time.monotonic() - started
    assert outcome.error_code == "timeout"
    assert elapsed < 3.0
    # the connection is usable afterwards
    assert executor.execute("world_1", world, "SELECT count(*) FROM city").result.rows == ((4079,),)


def test_row_cap(world: Path) -> None:
    executor = SqliteExecutor(ExecLimits(timeout_s=5.0, row_limit=100))
    assert executor.execute("world_1", world, "SELECT * FROM city AS a, city AS b").error_code == "row_limit"
    outcome = executor.execute("world_1", world, "SELECT ID FROM city ORDER BY ID LIMIT 100")
    assert outcome.ok and len(outcome.result.rows) == 100


def test_result_columns_and_rows(world: Path) -> None:
    executor = SqliteExecutor()
    outcome = executor.execute("world_1", world, "SELECT Name, Population FROM city WHERE ID = 1")
    assert outcome.result.columns == ("Name", "Population")
    assert outcome.result.rows == (("Kabul", 1780000),)


def test_known_names_are_lower_cased(world: Path) -> None:
    names = SqliteExecutor().known_names("world_1", world)
    assert {"city", "countrycode", "population", "countrylanguage", "isofficial"} <= names


def test_missing_database_file(tmp_path: Path) -> None:
    with pytest.raises(ExecutorError, match="not found"):
        SqliteExecutor().execute("nope", tmp_path / "nope.sqlite", "SELECT 1")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"timeout_s": 0}, "timeout_s"), ({"row_limit": 0}, "row_limit")],
)
def test_limits_are_validated(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ExecLimits(**kwargs)


def test_unknown_executor_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="valid: sqlite, postgres"):
        build_executor("duckdb", ExecLimits())
