"""eval_command end to end (gold mode), the files it writes, and the paired comparison of runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headstart.eval.cli import compare_command, eval_command
from headstart.eval.errors import ConfigError, DatasetError
from headstart.eval.report import load_run
from headstart.paths import default_spider_dir

needs_spider = pytest.mark.skipif(not (default_spider_dir() / "dev.json").is_file(), reason="Spider data not found")


@needs_spider
def test_gold_eval_writes_json_table_and_plot(tmp_path: Path) -> None:
    summary = eval_command(mode="gold", dataset="spider-dev", limit=20, out=tmp_path)
    assert (summary["n"], summary["skipped"], summary["execution_accuracy"], summary["exact_match"]) == (20, 0, 1.0, 1.0)
    assert summary["gold_sanity_passed"] is True
    data = json.loads((tmp_path / "eval.json").read_text())
    for key in ("n", "skipped", "execution_accuracy", "exact_match", "ttft_p50_ms", "execution_accuracy_ci95", "questions"):
        assert key in data
    assert data["ttft_p50_ms"] is None  # gold has no model, so no TTFT
    assert len(data["questions"]) == 20
    assert data["questions"][0]["status"] == "scored"
    assert data["config"]["mode"] == "gold"
    assert "| gold | 20 | 0 | 100.0% [83.9, 100.0]" in (tmp_path / "eval.md").read_text()
    assert (tmp_path / "eval.png").read_bytes()[:4] == b"\x89PNG"


@needs_spider
def test_dbs_accepts_commas(tmp_path: Path) -> None:
    summary = eval_command(mode="gold", dbs=["pets_1,singer"], out=tmp_path)
    assert set(summary["per_db"]) == {"pets_1", "singer"}
    assert summary["n"] == 72


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"mode": "warp"}, ConfigError, "valid: gold, cold, prefix, session, tables-pfk, tables-independent"),
        ({"mode": "cold"}, ConfigError, "needs --model"),
        ({"rules": "strict"}, ConfigError, "valid: bird, spider"),
        ({"executor": "duckdb"}, ConfigError, "valid: sqlite, postgres"),
        ({"dataset": "spider-train"}, DatasetError, "unknown dataset"),
    ],
)
def test_bad_options(tmp_path: Path, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        eval_command(out=tmp_path, **kwargs)


def fake_run(path: Path, mode: str, correct: list[bool], dataset: str = "spider-dev") -> Path:
    rows = [
        {"index": i, "gold_sql": f"SELECT {i}", "status": "scored", "correct": c,
         "pred_text": "SELECT right" if c else "SELECT wrong"} for i, c in enumerate(correct)
    ]
    summary = {"n": len(correct), "skipped": 0, "execution_accuracy": sum(correct) / len(correct),
               "execution_accuracy_ci95": [0.0, 1.0], "exact_match": 0.0, "exact_match_ci95": [0.0, 1.0],
               "ttft_p50_ms": 5.0, "ttft_p50_ci95_ms": [4.0, 6.0], "ttft_p90_ms": 7.0}
    path.mkdir(parents=True)
    (path / "eval.json").write_text(json.dumps({**summary, "config": {"mode": mode, "dataset": dataset}, "questions": rows}))
    return path


def test_compare_counts_flips_and_writes_files(tmp_path: Path) -> None:
    base = fake_run(tmp_path / "cold", "cold", [True, True, False, False, True])
    other = fake_run(tmp_path / "session", "session", [True, False, True, False, True])
    payload = compare_command([base, other], tmp_path / "cmp")
    (pair,) = payload["pairs"]
    assert {k: pair[k] for k in ("baseline", "other", "n", "both_right", "both_wrong", "right_to_wrong", "wrong_to_right")} == {
        "baseline": "cold", "other": "session", "n": 5, "both_right": 2, "both_wrong": 1,
        "right_to_wrong": 1, "wrong_to_right": 1,
    }
    assert (pair["right_to_wrong_indices"], pair["wrong_to_right_indices"], pair["p_value"]) == ([1], [2], 1.0)
    assert (pair["same_text"], pair["different_text_indices"]) == (3, [1, 2])  # answer texts, question by question
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| session | 5 | 2 | 1 | 1 | 1 | +0.0 pp | 1 | 3 of 5 |" in table
    assert (tmp_path / "cmp" / "compare.png").is_file()
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["pairs"][0]["n"] == 5


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"dataset": "bird-dev"}, "is on dataset 'bird-dev'"),
        ({"gold": "SELECT 99"}, "different gold SQL at question 0"),
    ],
)
def test_compare_refuses_unpaired_runs(tmp_path: Path, second: dict, message: str) -> None:
    base = fake_run(tmp_path / "a", "cold", [True])
    other = fake_run(tmp_path / "b", "prefix", [True], dataset=second.get("dataset", "spider-dev"))
    if "gold" in second:
        data = json.loads((other / "eval.json").read_text())
        data["questions"][0]["gold_sql"] = second["gold"]
        (other / "eval.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message):
        compare_command([base, other], tmp_path / "cmp")


def test_compare_needs_two_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least two runs"):
        compare_command([fake_run(tmp_path / "a", "cold", [True])], tmp_path / "cmp")


def test_load_run_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no eval.json"):
        load_run(tmp_path)
    (tmp_path / "eval.json").write_text("{}")
    with pytest.raises(DatasetError, match="not an eval.json written by headstart"):
        load_run(tmp_path)
