"""render_table / render_create_tables: exact text, quoting, table-locality."""

from __future__ import annotations

import pytest

from headstart.paths import default_spider_dir
from headstart.schema import (
    TABLE_SEPARATOR,
    Column,
    ForeignKey,
    Schema,
    Table,
    load_spider_tables,
    quote_identifier,
    render_create_tables,
    render_table,
)

SPIDER_TABLES = default_spider_dir() / "tables.json"


@pytest.mark.parametrize(
    ("name", "rendered"),
    [
        ("name", "name"),
        ("_x1", "_x1"),
        ("CountryCode", "CountryCode"),
        ("Year", "Year"),
        ("First Name", '"First Name"'),
        ("1st", '"1st"'),
        ("a-b", '"a-b"'),
        ("order", '"order"'),
        ("Match", '"Match"'),
        ("user", '"user"'),
        ('say "hi"', '"say ""hi"""'),
        ("café", '"café"'),
        ("", '""'),
    ],
)
def test_quote_identifier(name, rendered):
    assert quote_identifier(name) == rendered


COUNTRYLANGUAGE = Table(
    "countrylanguage",
    (
        Column("CountryCode", "char(3)", True),
        Column("Language", "char(30)", True),
        Column("Percentage", "float(4,1)"),
    ),
    ("CountryCode", "Language"),
    (ForeignKey(("CountryCode",), "country", ("Code",)),),
)
ODD = Table(
    "Order Items",
    (Column("order", "INTEGER", True), Column("note", "varchar(10)\n   NOT  NULL"), Column("x")),
    ("order",),
    (
        ForeignKey(("order",), "Order Items", ("order",)),
        ForeignKey(("x", "note"), "group", ("a b", "c")),
    ),
)


@pytest.mark.parametrize(
    ("table", "text"),
    [
        (
            COUNTRYLANGUAGE,
            "CREATE TABLE countrylanguage (\n"
            "  CountryCode char(3) NOT NULL,\n"
            "  Language char(30) NOT NULL,\n"
            "  Percentage float(4,1),\n"
            "  PRIMARY KEY (CountryCode, Language),\n"
            "  FOREIGN KEY (CountryCode) REFERENCES country(Code)\n"
            ");",
        ),
        (
            ODD,
            'CREATE TABLE "Order Items" (\n'
            '  "order" INTEGER NOT NULL,\n'
            "  note varchar(10) NOT NULL,\n"
            "  x,\n"
            '  PRIMARY KEY ("order"),\n'
            '  FOREIGN KEY ("order") REFERENCES "Order Items"("order"),\n'
            '  FOREIGN KEY (x, note) REFERENCES "group"("a b", c)\n'
            ");",
        ),
        (Table("log", (Column("at", "TEXT"),)), "CREATE TABLE log (\n  at TEXT\n);"),
        (Table("empty", ()), "CREATE TABLE empty ();"),
    ],
)
def test_render_table(table, text):
    assert render_table(table) == text


def test_render_create_tables_joins_tables_one_by_one():
    schema = Schema("d", (COUNTRYLANGUAGE, ODD))
    assert TABLE_SEPARATOR == "\n\n"
    assert render_create_tables(schema) == render_table(COUNTRYLANGUAGE) + "\n\n" + render_table(ODD)
    assert render_create_tables(Schema("d", ())) == ""


@pytest.mark.skipif(not SPIDER_TABLES.is_file(), reason=f"no {SPIDER_TABLES}")
def test_every_spider_schema_is_table_local_and_stable():
    for schema in load_spider_tables(SPIDER_TABLES).values():
        text = render_create_tables(schema)
        assert text == TABLE_SEPARATOR.join(render_table(t) for t in schema.tables)
        assert text.count("CREATE TABLE ") == len(schema.tables)
        assert text == render_create_tables(schema)


@pytest.mark.skipif(not SPIDER_TABLES.is_file(), reason=f"no {SPIDER_TABLES}")
def test_spider_car_1_cars_data():
    schema = load_spider_tables(SPIDER_TABLES)["car_1"]
    assert render_table(schema.table("cars_data")) == (
        "CREATE TABLE cars_data (\n"
        "  Id number,\n  MPG text,\n  Cylinders number,\n  Edispl number,\n"
        "  Horsepower text,\n  Weight number,\n  Accelerate number,\n  Year number,\n"
        "  PRIMARY KEY (Id),\n"
        "  FOREIGN KEY (Id) REFERENCES car_names(MakeId)\n"
        ");"
    )
