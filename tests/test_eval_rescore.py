"""A finished run scored again under other rules: the recorded answers, not new ones."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from headstart.eval.cli import eval_command
from headstart.eval.rescore import rescore_command


def test_rescore_replays_the_recorded_answers_under_other_rules(tmp_path: Path) -> None:
    db = tmp_path / "shop" / "shop.sqlite"
    db.parent.mkdir()
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "x"), (1, "x"), (2, "y")])
    # gold asks for DISTINCT; a prediction without it is wrong as written (spider) and right once the
    # official evaluator deletes every DISTINCT (spider-official)
    questions = [{"question": "which a?", "query": "SELECT DISTINCT a FROM t", "db_id": "shop"},
                 {"question": "how many?", "query": "SELECT count(*) FROM t", "db_id": "shop"}]
    dataset = tmp_path / "questions.json"
    dataset.write_text(json.dumps(questions))
    run = tmp_path / "run"
    eval_command(out=run, mode="gold", dataset=str(dataset), db_dir=tmp_path)
    recorded = json.loads((run / "eval.json").read_text())
    recorded["questions"][0]["pred_text"] = "SELECT a FROM t"  # as if the model had answered so
    recorded["questions"][0]["extra"] = {"decode_forwards": 7}
    (run / "eval.json").write_text(json.dumps(recorded))

    strict = rescore_command(run, "spider", tmp_path / "strict")
    official = rescore_command(run, "spider-official", tmp_path / "official")
    assert (strict["num_correct"], official["num_correct"]) == (1, 2)
    assert official["config"]["rescored_from"] == str(run) and official["config"]["rules"] == "spider-official"
    rows = json.loads((tmp_path / "official" / "eval.json").read_text())["questions"]
    assert rows[0]["pred_sql"].startswith("SELECT a FROM t") and rows[0]["extra"] == {"decode_forwards": 7}
