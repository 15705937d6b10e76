"""load_spider_tables / load_spider_schema on Spider, BIRD and crafted tables.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headstart.paths import default_bird_dir, default_spider_dir
from headstart.schema import Column, ForeignKey, SchemaError, load_spider_schema, load_spider_tables

SPIDER_TABLES = default_spider_dir() / "tables.json"
BIRD_TABLES = default_bird_dir() / "dev_tables.json"
needs_spider = pytest.mark.skipif(not SPIDER_TABLES.is_file(), reason=f"no {SPIDER_TABLES}")
needs_bird = pytest.mark.skipif(not BIRD_TABLES.is_file(), reason=f"no {BIRD_TABLES}")


def fk(cols, ref_table, ref_cols) -> ForeignKey:
    return ForeignKey(tuple(cols), ref_table, tuple(ref_cols))


def keys(schema) -> list[tuple[str, tuple[str, ...], tuple[ForeignKey, ...]]]:
    return [(t.name, t.primary_key, t.foreign_keys) for t in schema.tables]


# NOTE: Spider's tables.json lists only the first column of a composite
# primary key (countrylanguage is (CountryCode, Language) in the .sqlite file).
# The loader reports what the file says.
WORLD_1_KEYS = [
    ("city", ("ID",), (fk(["CountryCode"], "country", ["Code"]),)),
    ("country", ("Code",), ()),
    ("countrylanguage", ("CountryCode",), (fk(["CountryCode"], "country", ["Code"]),)),
]
CAR_1_KEYS = [
    ("continents", ("ContId",), ()),
    ("countries", ("CountryId",), (fk(["Continent"], "continents", ["ContId"]),)),
    ("car_makers", ("Id",), (fk(["Country"], "countries", ["CountryId"]),)),
    ("model_list", ("ModelId",), (fk(["Maker"], "car_makers", ["Id"]),)),
    ("car_names", ("MakeId",), (fk(["Model"], "model_list", ["Model"]),)),
    ("cars_data", ("Id",), (fk(["Id"], "car_names", ["MakeId"]),)),
]
# Spider lists Dogs.owner_id -> Owners.owner_id twice: one key remains.
DOG_KENNELS_DOGS_FKS = (
    fk(["owner_id"], "Owners", ["owner_id"]),
    fk(["size_code"], "Sizes", ["size_code"]),
    fk(["breed_code"], "Breeds", ["breed_code"]),
)


@needs_spider
@pytest.mark.parametrize(("db_id", "expected"), [("world_1", WORLD_1_KEYS), ("car_1", CAR_1_KEYS)])
def test_spider_keys(db_id, expected):
    schema = load_spider_schema(SPIDER_TABLES, db_id)
    assert (schema.db_id, schema.source, keys(schema)) == (db_id, str(SPIDER_TABLES), expected)


@needs_spider
def test_spider_columns_use_original_names_and_types():
    schema = load_spider_schema(SPIDER_TABLES, "world_1")
    assert schema.table("countrylanguage").columns == (
        Column("CountryCode", "text"),
        Column("Language", "text"),
        Column("IsOfficial", "text"),
        Column("Percentage", "number"),
    )


@needs_spider
def test_spider_all_dev_dbs_and_duplicates():
    schemas = load_spider_tables(SPIDER_TABLES)
    assert len(schemas) == 20
    assert "wta_1" in schemas
    assert schemas["dog_kennels"].table("Dogs").foreign_keys == DOG_KENNELS_DOGS_FKS


BIRD_COMPOSITE_PKS = {
    ("debit_card_specializing", "yearmonth"): ("CustomerID", "Date"),
    ("formula_1", "lapTimes"): ("raceId", "driverId", "lap"),
    ("formula_1", "pitStops"): ("raceId", "driverId", "stop"),
    ("thrombosis_prediction", "Laboratory"): ("ID", "Date"),
    ("toxicology", "connected"): ("atom_id", "atom_id2"),
    ("student_club", "attendance"): ("link_to_event", "link_to_member"),
}


@needs_bird
def test_bird_dev_loads_all_eleven():
    schemas = load_spider_tables(BIRD_TABLES)
    assert {db: len(s.tables) for db, s in schemas.items()} == {
        "debit_card_specializing": 5,
        "financial": 8,
        "formula_1": 13,
        "california_schools": 3,
        "card_games": 6,
        "european_football_2": 7,
        "thrombosis_prediction": 3,
        "toxicology": 4,
        "student_club": 8,
        "superhero": 10,
        "codebase_community": 8,
    }
    composite = {
        (db, t.name): t.primary_key
        for db, s in schemas.items()
        for t in s.tables
        if len(t.primary_key) > 1
    }
    assert composite == BIRD_COMPOSITE_PKS


@needs_bird
def test_bird_consecutive_single_column_keys_stay_separate():
    # 22 consecutive pairs Match -> Player: Player's PK is one column, so no grouping.
    match = load_spider_schema(BIRD_TABLES, "european_football_2").table("Match")
    to_player = [f for f in match.foreign_keys if f.ref_table == "Player"]
    assert len(to_player) == 22
    assert all(len(f.columns) == 1 for f in to_player)


def write_tables(tmp_path: Path, *entries: dict) -> Path:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(list(entries)))
    return path


def entry(primary_keys: list, foreign_keys: list, db_id: str = "d") -> dict:
    """Tables p(x, y, z) and c(a, b, q): column indices p.x=1 p.y=2 p.z=3 c.a=4 c.b=5 c.q=6."""
    return {
        "db_id": db_id,
        "table_names_original": ["p", "c"],
        "table_names": ["p", "c"],
        "column_names_original": [[-1, "*"], [0, "x"], [0, "y"], [0, "z"], [1, "a"], [1, "b"], [1, "q"]],
        "column_names": [[-1, "*"], [0, "x"], [0, "y"], [0, "z"], [1, "a"], [1, "b"], [1, "q"]],
        "column_types": ["text", "number", "text", "text", "number", "text", "text"],
        "primary_keys": primary_keys,
        "foreign_keys": foreign_keys,
    }


@pytest.mark.parametrize(
    ("primary_keys", "foreign_keys", "p_pk", "c_fks"),
    [
        pytest.param([[1, 2]], [[4, 1], [5, 2]], ("x", "y"),
                     (fk(["a", "b"], "p", ["x", "y"]),), id="consecutive-composite"),
        pytest.param([[1, 2]], [[5, 2], [4, 1]], ("x", "y"),
                     (fk(["b", "a"], "p", ["y", "x"]),), id="composite-pair-order-kept"),
        pytest.param([1, 2], [[4, 1], [5, 2]], ("x", "y"),
                     (fk(["a", "b"], "p", ["x", "y"]),), id="composite-pk-as-ints"),
        pytest.param([[1, 2]], [[4, 1], [6, 3], [5, 2]], ("x", "y"),
                     (fk(["a"], "p", ["x"]), fk(["q"], "p", ["z"]), fk(["b"], "p", ["y"])),
                     id="not-consecutive"),
        pytest.param([1], [[4, 1], [5, 1]], ("x",),
                     (fk(["a"], "p", ["x"]), fk(["b"], "p", ["x"])), id="single-pk-parent"),
        pytest.param([[1, 2, 3]], [[4, 1], [5, 2]], ("x", "y", "z"),
                     (fk(["a"], "p", ["x"]), fk(["b"], "p", ["y"])), id="partial-composite"),
        pytest.param([[1, 2]], [[4, 1], [4, 1], [5, 2]], ("x", "y"),
                     (fk(["a", "b"], "p", ["x", "y"]),), id="duplicates-dropped-first"),
        pytest.param([[1, 2]], [[4, 1], [5, 1]], ("x", "y"),
                     (fk(["a"], "p", ["x"]), fk(["b"], "p", ["x"])), id="same-parent-column"),
        pytest.param([], [], (), (), id="no-keys"),
    ],
)  # fmt: skip
def test_crafted_foreign_key_grouping(tmp_path, primary_keys, foreign_keys, p_pk, c_fks):
    schema = load_spider_schema(write_tables(tmp_path, entry(primary_keys, foreign_keys)), "d")
    assert keys(schema) == [("p", p_pk, ()), ("c", (), c_fks)]


def test_self_reference_and_sqlite_tables(tmp_path):
    raw = entry([1, 4], [[5, 4], [6, 1]])
    raw["table_names_original"].append("sqlite_sequence")
    raw["column_names_original"] += [[2, "name"], [2, "seq"]]
    raw["column_types"] += ["text", "text"]
    schema = load_spider_schema(write_tables(tmp_path, raw), "d")
    assert keys(schema) == [
        ("p", ("x",), ()),
        ("c", ("a",), (fk(["b"], "c", ["a"]), fk(["q"], "p", ["x"]))),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read tables file '{path}': [Errno 2] No such file or directory: '{path}'"),
        ("{not json", "tables file '{path}' is not valid JSON: Expecting property name enclosed "
                      "in double quotes: line 1 column 2 (char 1)"),
        ('{"db_id": "x"}', "tables file '{path}' must hold a JSON list of databases"),
        ('[{"db_id": "x"}]', "database 'x' in '{path}' is malformed: KeyError: 'table_names_original'"),
    ],
)  # fmt: skip
def test_file_errors(tmp_path, content, message):
    path = tmp_path / "tables.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SchemaError) as info:
        load_spider_tables(path)
    assert str(info.value) == message.format(path=path)


def test_duplicate_db_id(tmp_path):
    path = write_tables(tmp_path, entry([], []), entry([], []))
    with pytest.raises(SchemaError, match="lists db_id 'd' twice"):
        load_spider_tables(path)


@pytest.mark.parametrize(
    ("db_id", "hint"),
    [
        ("world1", "did you mean: world_1?"),
        ("WORLD_1", "did you mean: world_1?"),
        ("car", "did you mean: car_1?"),
        ("zzzz", "known ids: car_1, world_1"),
    ],
)
def test_unknown_db_id_suggests(tmp_path, db_id, hint):
    path = write_tables(tmp_path, entry([], [], "world_1"), entry([], [], "car_1"))
    with pytest.raises(SchemaError) as info:
        load_spider_schema(path, db_id)
    assert str(info.value) == f"unknown database id {db_id!r} in {str(path)!r}; {hint}"
