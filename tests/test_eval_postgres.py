"""PostgreSQL executor: world_1 and car_1 migrate with row counts, types and keys; queries are contained.

Uses the session PostgreSQL of tests/pg_fixture.py (`postgres_dsn`), in a
database of this module's own.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from headstart.eval.compare import get_rule
from headstart.eval.dataset import load_dataset
from headstart.eval.executors import ExecLimits
from headstart.eval.executors.pg_catalog import column_types, foreign_keys
from headstart.eval.executors.pg_migrate import migrate_sqlite
from headstart.eval.executors.postgres import PostgresExecutor
from headstart.eval.generators import GoldGenerator
from headstart.eval.harness import run_eval
from headstart.eval.summary import summarize
from headstart.paths import default_spider_dir
from tests.pg_fixture import dsn_for_database

DATABASES = default_spider_dir() / "database"
pytestmark = pytest.mark.skipif(not (DATABASES / "car_1").is_dir(), reason="Spider data not found")


def sqlite_file(db: str) -> Path:
    return DATABASES / db / f"{db}.sqlite"


@pytest.fixture(scope="module")
def eval_dsn(postgres_dsn: str):
    name = f"headstart_eval_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield dsn_for_database(postgres_dsn, name)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sqlite_counts(db: str) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{sqlite_file(db)}?mode=ro", uri=True)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
    counts = {t.lower(): conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
    conn.close()
    return counts


def sqlite_foreign_keys(db: str) -> set[tuple]:
    conn = sqlite3.connect(f"file:{sqlite_file(db)}?mode=ro", uri=True)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
    out = {(t.lower(), (fk[3].lower(),), fk[2].lower(), (fk[4].lower(),))
           for t in tables for fk in conn.execute(f'PRAGMA foreign_key_list("{t}")')}
    conn.close()
    return out


# Foreign keys Spider's own data violates: declared NOT VALID (rows are kept as they are).
NOT_VALID = {
    "world_1": set(),
    "car_1": {("model_list", ("maker",), "car_makers", ("id",)), ("car_names", ("model",), "model_list", ("model",))},
}


@pytest.mark.parametrize("db", ["world_1", "car_1"])
def test_migration_round_trips_row_counts_and_foreign_keys(eval_dsn: str, db: str) -> None:
    with psycopg.connect(eval_dsn) as conn:
        report = migrate_sqlite(conn, sqlite_file(db), db, force=True)
        assert report.row_counts == sqlite_counts(db)
        got = {(fk.table, fk.columns, fk.ref_table, fk.ref_columns): fk.validated for fk in foreign_keys(conn, db)}
        assert set(got) == sqlite_foreign_keys(db)
        assert {key for key, valid in got.items() if not valid} == NOT_VALID[db]
        assert report.foreign_keys == foreign_keys(conn, db)
        again = migrate_sqlite(conn, sqlite_file(db), db)
        assert (again.reused, again.row_counts) == (True, report.row_counts)


@pytest.mark.parametrize(
    ("db", "table", "expected"),
    [
        ("world_1", "city", {"id": "integer", "name": "character varying(35)", "countrycode": "character varying(3)",
                             "district": "character varying(20)", "population": "integer"}),
        ("world_1", "countrylanguage", {"countrycode": "character varying(3)", "language": "character varying(30)",
                                        "isofficial": "text", "percentage": "double precision"}),
        # Country is declared TEXT but references the INTEGER countries.CountryId: retyped, and reported.
        ("car_1", "car_makers", {"id": "integer", "maker": "text", "fullname": "text", "country": "integer"}),
        ("car_1", "cars_data", {"id": "integer", "mpg": "text", "cylinders": "integer", "edispl": "double precision",
                                "horsepower": "text", "weight": "integer", "accelerate": "double precision",
                                "year": "integer"}),
    ],
)
def test_migrated_column_types(eval_dsn: str, db: str, table: str, expected: dict[str, str]) -> None:
    with psycopg.connect(eval_dsn) as conn:
        migrate_sqlite(conn, sqlite_file(db), db)
        assert column_types(conn, db)[table] == expected


def test_every_compromise_is_reported(eval_dsn: str) -> None:
    with psycopg.connect(eval_dsn) as conn:
        notes = migrate_sqlite(conn, sqlite_file("car_1"), "car_1", force=True).notes
    assert [note.split(" (")[0] for note in notes] == [
        "car_makers.country: declared text, stored as integer like countries.countryid so the foreign key can be declared",
        "foreign key model_list(maker) -> car_makers(id) added NOT VALID: existing rows violate it",
        "model_list(model): UNIQUE added so car_names(model) -> model_list(model) can be declared",
        "foreign key car_names(model) -> model_list(model) added NOT VALID: existing rows violate it",
    ]


@pytest.mark.parametrize(
    ("db", "primary_keys"),
    [
        ("world_1", {"city": ["id"], "country": ["code"], "countrylanguage": ["countrycode", "language"]}),
        ("car_1", {"continents": ["contid"], "countries": ["countryid"], "car_makers": ["id"],
                   "model_list": ["modelid"], "car_names": ["makeid"], "cars_data": ["id"]}),
    ],
)
def test_primary_keys_preserved(eval_dsn: str, db: str, primary_keys: dict[str, list[str]]) -> None:
    with psycopg.connect(eval_dsn) as conn:
        migrate_sqlite(conn, sqlite_file(db), db)
        rows = conn.execute(
            """SELECT c.relname, array(SELECT a.attname FROM unnest(k.conkey) WITH ORDINALITY u(n, i)
                      JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n ORDER BY u.i)::text[]
               FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace s ON s.oid = c.relnamespace
               WHERE k.contype = 'p' AND s.nspname = %s""", (db,)).fetchall()
    assert dict(rows) == primary_keys


@pytest.fixture(scope="module")
def executor(eval_dsn: str):
    runner = PostgresExecutor(eval_dsn, ExecLimits(timeout_s=1.0, row_limit=10_000))
    yield runner
    runner.close()


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("SELECT count(*) FROM city", None),
        ("DROP TABLE city", "denied"),
        ("DELETE FROM city", "denied"),
        ("SELECT 1; DROP TABLE city", "multiple_statements"),
        ("SELECT pg_read_file('/etc/passwd')", "denied"),
        ("WITH d AS (DELETE FROM city RETURNING *) SELECT count(*) FROM d", "sql_error"),
        ("SELECT pg_sleep(30)", "timeout"),
        ("SELECT count(*) FROM city AS a, city AS b, city AS c", "timeout"),
        ("SELECT * FROM city AS a, city AS b", "row_limit"),
        ("SELECT nope FROM city", "sql_error"),
    ],
)
def test_dangerous_queries_are_contained(executor: PostgresExecutor, sql: str, code: str | None) -> None:
    started = time.monotonic()
    outcome = executor.execute("world_1", sqlite_file("world_1"), sql)
    assert outcome.error_code == code
    assert time.monotonic() - started < 5.0
    assert executor.execute("world_1", sqlite_file("world_1"), "SELECT count(*) FROM city").result.rows == ((4079,),)


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ('SELECT Name FROM city WHERE CountryCode = "NLD" AND Population > 700000', (("Amsterdam",),)),
        ("SELECT count(*) FROM country WHERE name LIKE 'united%'", ((4,),)),  # LIKE ignores case, as in SQLite
        ("SELECT count(*) FROM cars_data WHERE Year = '1970'", ((35,),)),
    ],
)
def test_sqlite_flavoured_sql_runs(executor: PostgresExecutor, sql: str, rows: tuple) -> None:
    db = "car_1" if "cars_data" in sql else "world_1"
    assert executor.execute(db, sqlite_file(db), sql).result.rows == rows


def test_gold_on_gold_on_postgres(executor: PostgresExecutor) -> None:
    data = load_dataset("spider-dev", dbs=["world_1", "car_1"])
    rows = run_eval(data.questions, GoldGenerator(), executor, get_rule("spider"))
    summary = summarize(rows)
    assert (summary["n"], summary["gold_errors"], summary["num_correct"]) == (212, 0, 212)


def test_eval_command_on_postgres(eval_dsn: str, tmp_path: Path) -> None:
    from headstart.eval.cli import eval_command

    summary = eval_command(mode="gold", executor="postgres", postgres_dsn=eval_dsn, limit=20, out=tmp_path)
    assert (summary["n"], summary["num_correct"], summary["gold_errors"]) == (20, 20, 0)
    assert summary["config"]["executor"] == "postgres"


def test_a_foreign_schema_is_never_dropped(eval_dsn: str) -> None:
    from headstart.eval.errors import MigrationError

    with psycopg.connect(eval_dsn) as conn:
        conn.execute("CREATE SCHEMA pets_1")
        conn.execute("CREATE TABLE pets_1.precious (x int)")
        conn.commit()
        with pytest.raises(MigrationError, match="exists and was not made by headstart"):
            migrate_sqlite(conn, sqlite_file("pets_1"), "pets_1")
        assert conn.execute("SELECT count(*) FROM pets_1.precious").fetchone() == (0,)
