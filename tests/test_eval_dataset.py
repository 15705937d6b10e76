"""Loading spider-dev, bird-dev and FILE.json into EvalQuestions; filters and skip reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headstart.eval.dataset import load_dataset
from headstart.eval.errors import ConfigError, DatasetError
from headstart.paths import default_bird_dir, default_spider_dir

SPIDER = default_spider_dir()
needs_spider = pytest.mark.skipif(not (SPIDER / "dev.json").is_file(), reason="Spider data not found")
needs_bird = pytest.mark.skipif(not (default_bird_dir() / "dev.json").is_file(), reason="BIRD data not found")


@needs_spider
def test_spider_dev_counts_and_wta_1_skipped() -> None:
    data = load_dataset("spider-dev")
    assert len(data.questions) == 1034
    assert data.num_skipped == 62
    skipped = {q.db_id for q in data.questions if q.skipped}
    assert skipped == {"wta_1"}
    assert all("database file missing" in q.skip_reason and "wta_1.sqlite" in q.skip_reason
               for q in data.questions if q.skipped)
    first = data.questions[0]
    assert (first.index, first.db_id, first.gold_sql) == (0, "concert_singer", "SELECT count(*) FROM singer")
    assert first.db_path == SPIDER / "database" / "concert_singer" / "concert_singer.sqlite"


@needs_spider
@pytest.mark.parametrize(
    ("dbs", "limit", "count", "db_ids"),
    [
        (["world_1"], None, 120, {"world_1"}),
        (["world_1", "car_1"], None, 212, {"world_1", "car_1"}),
        (None, 20, 20, {"concert_singer"}),
        (["pets_1"], 5, 5, {"pets_1"}),
        (["wta_1"], 3, 3, {"wta_1"}),
    ],
)
def test_filters(dbs: list[str] | None, limit: int | None, count: int, db_ids: set[str]) -> None:
    data = load_dataset("spider-dev", dbs=dbs, limit=limit)
    assert len(data.questions) == count
    assert {q.db_id for q in data.questions} == db_ids


@needs_spider
def test_unknown_db_lists_available() -> None:
    with pytest.raises(DatasetError, match="--dbs nope not in the dataset; available: battle_death"):
        load_dataset("spider-dev", dbs=["nope"])


@needs_bird
def test_bird_dev_without_databases_is_all_skipped() -> None:
    data = load_dataset("bird-dev", limit=10)
    assert len(data.questions) == 10
    assert data.num_skipped == 10
    assert "pass --db-dir" in data.questions[0].skip_reason
    assert data.questions[0].evidence.startswith("Eligible free rate")
    assert data.questions[0].difficulty == "simple"


def test_file_json_with_db_dir(tmp_path: Path) -> None:
    db_dir = tmp_path / "dbs"
    (db_dir / "shop").mkdir(parents=True)
    (db_dir / "shop" / "shop.sqlite").write_bytes(b"")
    questions = [
        {"question": "How many?", "query": "SELECT count(*) FROM t", "db_id": "shop"},
        {"question": "Gone?", "query": "SELECT 1", "db_id": "gone"},
    ]
    path = tmp_path / "qs.json"
    path.write_text(json.dumps(questions))
    data = load_dataset(str(path), db_dir=db_dir)
    assert [(q.index, q.db_id, q.skipped) for q in data.questions] == [(0, "shop", False), (1, "gone", True)]
    assert data.questions[0].db_path == db_dir / "shop" / "shop.sqlite"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{}", "must hold a JSON list"),
        ("[1]", "question 0 is not an object"),
        ('[{"question": "q", "db_id": "d"}]', "lacks a string field 'query'"),
        ("not json", "is not valid JSON"),
    ],
)
def test_malformed_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(path))


@pytest.mark.parametrize(
    ("name", "kwargs", "error", "message"),
    [
        ("spider-test", {}, DatasetError, "valid: spider-dev, bird-dev or a path"),
        ("/no/such/file.json", {}, DatasetError, "dataset file not found"),
        ("spider-dev", {"limit": 0}, ConfigError, "--limit must be a positive"),
    ],
)
def test_bad_names_and_limits(name: str, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        load_dataset(name, **kwargs)
