"""load_sqlite_schema on Spider files and on crafted databases."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from headstart.paths import default_spider_dir
from headstart.schema import Column, ForeignKey, SchemaError, load_sqlite_schema

SPIDER_DB = default_spider_dir() / "database"
needs_spider = pytest.mark.skipif(
    not (SPIDER_DB / "world_1" / "world_1.sqlite").is_file(), reason=f"no Spider data in {SPIDER_DB}"
)


def fk(cols, ref_table, ref_cols) -> ForeignKey:
    return ForeignKey(tuple(cols), ref_table, tuple(ref_cols))


def make_db(path: Path, ddl: str) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(ddl)
    conn.close()
    return path


def keys(schema) -> list[tuple[str, tuple[str, ...], tuple[ForeignKey, ...]]]:
    return [(t.name, t.primary_key, t.foreign_keys) for t in schema.tables]


WORLD_1_KEYS = [
    ("city", ("ID",), (fk(["CountryCode"], "country", ["Code"]),)),
    ("country", ("Code",), ()),
    ("countrylanguage", ("CountryCode", "Language"), (fk(["CountryCode"], "country", ["Code"]),)),
]
CAR_1_KEYS = [
    ("continents", ("ContId",), ()),
    ("countries", ("CountryId",), (fk(["Continent"], "continents", ["ContId"]),)),
    ("car_makers", ("Id",), (fk(["Country"], "countries", ["CountryId"]),)),
    ("model_list", ("ModelId",), (fk(["Maker"], "car_makers", ["Id"]),)),
    ("car_names", ("MakeId",), (fk(["Model"], "model_list", ["Model"]),)),
    ("cars_data", ("Id",), (fk(["Id"], "car_names", ["MakeId"]),)),
]


@needs_spider
@pytest.mark.parametrize(("db_id", "expected"), [("world_1", WORLD_1_KEYS), ("car_1", CAR_1_KEYS)])
def test_spider_files_tables_and_keys(db_id, expected):
    path = SPIDER_DB / db_id / f"{db_id}.sqlite"
    schema = load_sqlite_schema(path)
    assert (schema.db_id, schema.source, schema.extras) == (db_id, str(path), {})
    assert keys(schema) == expected


@needs_spider
@pytest.mark.parametrize(
    ("table", "columns"),
    [
        (
            "countrylanguage",
            (
                Column("CountryCode", "char(3)", True),
                Column("Language", "char(30)", True),
                # SQLite reports its standard type names (INTEGER, TEXT, ...) upper-cased.
                Column("IsOfficial", "TEXT", True),
                Column("Percentage", "float(4,1)", True),
            ),
        ),
        (
            "city",
            (
                Column("ID", "INTEGER", True),
                Column("Name", "char(35)", True),
                Column("CountryCode", "char(3)", True),
                Column("District", "char(20)", True),
                Column("Population", "INTEGER", True),
            ),
        ),
    ],
)
def test_world_1_columns(table, columns):
    schema = load_sqlite_schema(SPIDER_DB / "world_1" / "world_1.sqlite")
    assert schema.table(table).columns == columns


@needs_spider
def test_db_id_override_and_internal_tables_skipped():
    schema = load_sqlite_schema(SPIDER_DB / "world_1" / "world_1.sqlite", db_id="world")
    assert schema.db_id == "world"
    assert "sqlite_sequence" not in schema.table_names


CRAFTED = [
    pytest.param(
        """
        CREATE TABLE enrollment (course_id INT, term CHAR(6), seats INT NOT NULL,
                                 PRIMARY KEY (term, course_id));
        CREATE TABLE grade (id INTEGER PRIMARY KEY, c INT, t CHAR(6),
                            FOREIGN KEY (t, c) REFERENCES enrollment (term, course_id));
        """,
        [
            ("enrollment", ("term", "course_id"), ()),
            ("grade", ("id",), (fk(["t", "c"], "enrollment", ["term", "course_id"]),)),
        ],
        id="composite-fk",
    ),
    pytest.param(
        "CREATE TABLE employee (id INTEGER PRIMARY KEY, manager_id INT REFERENCES employee(id));",
        [("employee", ("id",), (fk(["manager_id"], "employee", ["id"]),))],
        id="self-reference",
    ),
    pytest.param(
        """
        CREATE TABLE a (id INT PRIMARY KEY, b_id INT REFERENCES b(id));
        CREATE TABLE b (id INT PRIMARY KEY, a_id INT REFERENCES a(id));
        """,
        [
            ("a", ("id",), (fk(["b_id"], "b", ["id"]),)),
            ("b", ("id",), (fk(["a_id"], "a", ["id"]),)),
        ],
        id="two-table-cycle",
    ),
    pytest.param(
        "CREATE TABLE log (at TEXT, message TEXT);",
        [("log", (), ())],
        id="no-keys",
    ),
    pytest.param(
        """
        CREATE TABLE p (x INT, y INT, PRIMARY KEY (y, x));
        CREATE TABLE q (id INT PRIMARY KEY);
        CREATE TABLE c (a INT, b INT, q_id INT,
                        FOREIGN KEY (a, b) REFERENCES p,
                        FOREIGN KEY (q_id) REFERENCES Q);
        """,
        [
            ("p", ("y", "x"), ()),
            ("q", ("id",), ()),
            # Omitted columns are the referenced PK, in PK order; the
            # pragma lists the last declared key first.
            ("c", (), (fk(["q_id"], "q", ["id"]), fk(["a", "b"], "p", ["y", "x"]))),
        ],
        id="omitted-ref-columns",
    ),
    pytest.param(
        """
        CREATE TABLE Parent (Id INT PRIMARY KEY);
        CREATE TABLE child (pid INT, FOREIGN KEY (PID) REFERENCES parent (ID),
                                     FOREIGN KEY (PID) REFERENCES parent (ID));
        """,
        [("Parent", ("Id",), ()), ("child", (), (fk(["pid"], "Parent", ["Id"]),))],
        id="names-respelled-and-duplicate-dropped",
    ),
]


@pytest.mark.parametrize(("ddl", "expected"), CRAFTED)
def test_crafted_keys(tmp_path, ddl, expected):
    schema = load_sqlite_schema(make_db(tmp_path / "x.sqlite", ddl))
    assert (schema.db_id, keys(schema), schema.extras) == ("x", expected, {})


def test_unresolvable_foreign_keys_are_listed_not_kept(tmp_path):
    ddl = """
        CREATE TABLE norowpk (v INT);
        CREATE TABLE c (a INT REFERENCES missing(id), b INT REFERENCES norowpk, d INT);
    """
    schema = load_sqlite_schema(make_db(tmp_path / "x.db", ddl))
    assert keys(schema) == [("norowpk", (), ()), ("c", (), ())]
    assert schema.extras == {
        "skipped_foreign_keys": [
            "c(b) -> norowpk: referenced columns omitted and 'norowpk' has 0 primary-key column(s) for 1",
            "c(a) -> missing: table 'missing' does not exist",
        ]
    }


def test_columns_types_not_null_and_generated(tmp_path):
    ddl = """CREATE TABLE t (a INTEGER NOT NULL, "b c" varchar(10), untyped,
                             g INT GENERATED ALWAYS AS (a + 1));"""
    schema = load_sqlite_schema(make_db(tmp_path / "t.sqlite", ddl))
    assert schema.table("t").columns == (
        Column("a", "INTEGER", True),
        Column("b c", "varchar(10)", False),
        Column("untyped", "", False),
        Column("g", "INT", False),
    )


def test_file_is_opened_read_only(tmp_path):
    path = make_db(tmp_path / "ro.sqlite", "CREATE TABLE t (a INT);")
    before = path.read_bytes()
    load_sqlite_schema(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro.sqlite"]


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nope.sqlite"


def _not_a_db(tmp_path: Path) -> Path:
    path = tmp_path / "notes.sqlite"
    path.write_text("this is not a database, just some text " * 100)
    return path


def _empty_file(tmp_path: Path) -> Path:
    path = tmp_path / "empty.sqlite"
    path.write_bytes(b"")
    return path


def _only_a_view(tmp_path: Path) -> Path:
    path = make_db(tmp_path / "view.sqlite", "CREATE TABLE t (a); CREATE VIEW v AS SELECT 1; DROP TABLE t;")
    return path


def _directory(tmp_path: Path) -> Path:
    return tmp_path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_missing, "SQLite database '{path}' does not exist or is not a file"),
        (_directory, "SQLite database '{path}' does not exist or is not a file"),
        (_not_a_db, "cannot read SQLite database '{path}': file is not a database"),
        (_empty_file, "SQLite database '{path}' has no tables"),
        (_only_a_view, "SQLite database '{path}' has no tables"),
    ],
)
def test_errors_name_the_path(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(SchemaError) as info:
        load_sqlite_schema(path)
    assert str(info.value) == message.format(path=path)
    assert not (tmp_path / "nope.sqlite").exists()  # read-only open never creates the file
