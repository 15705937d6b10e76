"""resolve_database: Spider ids, SQLite paths, PostgreSQL DSNs and unknown specs."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest

from headstart.paths import default_spider_dir
from headstart.schema import ResolvedDatabase, SchemaError, resolve_database

SPIDER = default_spider_dir()
needs_spider = pytest.mark.skipif(
    not (SPIDER / "database" / "world_1" / "world_1.sqlite").is_file(), reason=f"no Spider data in {SPIDER}"
)


@needs_spider
@pytest.mark.parametrize(
    ("db_id", "has_file", "tables"),
    [
        ("world_1", True, ["city", "country", "countrylanguage"]),
        ("car_1", True, ["continents", "countries", "car_makers", "model_list", "car_names", "cars_data"]),
        ("wta_1", False, ["players", "matches", "rankings"]),
    ],
)
def test_spider_ids(db_id, has_file, tables):
    resolved = resolve_database(db_id, spider_dir=SPIDER)
    expected_path = (SPIDER / "database" / db_id / f"{db_id}.sqlite").resolve() if has_file else None
    assert (resolved.kind, resolved.sqlite_path, resolved.dsn) == ("spider", expected_path, None)
    assert (resolved.schema.db_id, resolved.schema.table_names) == (db_id, tables)
    # the SQLite file wins when present (tables.json truncates composite keys)
    assert resolved.schema.source == str(expected_path if has_file else SPIDER / "tables.json")


@needs_spider
def test_spider_id_keeps_composite_primary_key():
    schema = resolve_database("world_1", spider_dir=SPIDER).schema
    assert schema.table("countrylanguage").primary_key == ("CountryCode", "Language")


@needs_spider
def test_default_spider_dir():
    assert resolve_database("car_1").kind == "spider"


@pytest.fixture
def small_db(tmp_path) -> Path:
    path = tmp_path / "shop.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE item (id INTEGER PRIMARY KEY)")
    conn.close()
    return path


@pytest.mark.parametrize("form", ["absolute", "renamed-no-suffix"])
def test_sqlite_paths(tmp_path, small_db, monkeypatch, form):
    if form == "renamed-no-suffix":
        # A bare name that is no Spider id but an existing file is a SQLite path.
        monkeypatch.chdir(tmp_path)
        small_db = Path(shutil.copy(small_db, tmp_path / "shopfile"))
        spec = "shopfile"
    else:
        spec = str(small_db)
    resolved = resolve_database(spec, spider_dir=tmp_path / "no-spider")
    assert (resolved.kind, resolved.sqlite_path, resolved.dsn) == ("sqlite", small_db, None)
    assert (resolved.schema.db_id, resolved.schema.table_names) == (small_db.stem, ["item"])


def test_missing_sqlite_path_names_it(tmp_path):
    with pytest.raises(SchemaError, match="does not exist or is not a file"):
        resolve_database(str(tmp_path / "gone.sqlite"))


def test_postgres_dsn(postgres_database):
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, name text)")
    resolved = resolve_database(postgres_database)
    dbname = psycopg.conninfo.conninfo_to_dict(postgres_database)["dbname"]
    assert (resolved.kind, resolved.sqlite_path, resolved.dsn) == ("postgres", None, postgres_database)
    assert (resolved.schema.db_id, resolved.schema.table_names) == (dbname, ["item"])


def test_dsn_is_kept_out_of_repr(tmp_path, small_db):
    resolved = ResolvedDatabase(
        resolve_database(str(small_db)).schema, "postgres", dsn="postgresql://u:secret@h/db"
    )
    assert "secret" not in repr(resolved)


@pytest.mark.parametrize(
    ("spec", "tail"),
    [
        ("world1", "not a Spider db id in '{tables}' (did you mean: world_1?)"),
        ("nothing_like_it", "not a Spider db id in '{tables}' (known ids: car_1, world_1)"),
    ],
)
def test_unknown_spec_says_what_was_tried(tmp_path, spec, tail):
    spider = tmp_path / "spider"
    spider.mkdir()
    tables = spider / "tables.json"
    tables.write_text(json.dumps([_entry("world_1"), _entry("car_1")]))
    with pytest.raises(SchemaError) as info:
        resolve_database(spec, spider_dir=spider)
    assert str(info.value) == (
        f"cannot resolve database {spec!r}: not a PostgreSQL DSN (postgresql:// or postgres://), "
        f"not a SQLite file (no file {spec!r}), " + tail.format(tables=tables)
    )


def test_unknown_spec_without_spider_data(tmp_path):
    with pytest.raises(SchemaError, match=r"not a Spider db id \(no '.*tables\.json'\)"):
        resolve_database("x", spider_dir=tmp_path)


def test_empty_spec():
    with pytest.raises(SchemaError, match="empty database spec"):
        resolve_database("  ")


def _entry(db_id: str) -> dict:
    return {
        "db_id": db_id,
        "table_names_original": ["t"],
        "column_names_original": [[-1, "*"], [0, "a"]],
        "column_types": ["text", "text"],
        "primary_keys": [],
        "foreign_keys": [],
    }
