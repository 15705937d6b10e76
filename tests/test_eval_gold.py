"""Gold-on-gold: the gold SQL scored against itself is 100% on every Spider database present.

All 972 questions of the 19 shipped databases run (about 2 s per rule set on
one core); wta_1's 62 questions are skipped because its file is not shipped.
"""

from __future__ import annotations

import pytest

from headstart.eval.compare import get_rule
from headstart.eval.dataset import load_dataset
from headstart.eval.executors.sqlite import SqliteExecutor
from headstart.eval.generators import GoldGenerator
from headstart.eval.harness import run_eval
from headstart.eval.summary import summarize
from headstart.paths import default_spider_dir

SPIDER_DBS = {
    "battle_death", "car_1", "concert_singer", "course_teach", "cre_Doc_Template_Mgt", "dog_kennels",
    "employee_hire_evaluation", "flight_2", "museum_visit", "network_1", "orchestra", "pets_1",
    "poker_player", "real_estate_properties", "singer", "student_transcripts_tracking", "tvshow",
    "voter_1", "world_1",
}
pytestmark = pytest.mark.skipif(
    not (default_spider_dir() / "dev.json").is_file(), reason="Spider data not found"
)


@pytest.mark.parametrize("rules", ["spider", "bird", "spider-official"])
def test_gold_on_gold_is_100_percent_on_every_database(rules: str) -> None:
    data = load_dataset("spider-dev")
    executor = SqliteExecutor()
    rows = run_eval(data.questions, GoldGenerator(), executor, get_rule(rules))
    executor.close()
    summary = summarize(rows)
    assert (summary["total"], summary["n"], summary["skipped"], summary["gold_errors"]) == (1034, 972, 62, 0)
    assert (summary["num_correct"], summary["num_exact"]) == (972, 972)
    assert set(summary["per_db"]) == SPIDER_DBS
    assert {db: m["execution_accuracy"] for db, m in summary["per_db"].items()} == dict.fromkeys(SPIDER_DBS, 1.0)
    assert summary["skip_reasons"] == {
        f"database file missing: {default_spider_dir() / 'database' / 'wta_1' / 'wta_1.sqlite'}": 62
    }
