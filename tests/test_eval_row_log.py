"""A killed eval run keeps every answer it gave, and `--resume` goes on from them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from headstart.eval import cli as eval_cli
from headstart.eval.cli import eval_command
from headstart.eval.errors import ConfigError, DatasetError
from headstart.eval.row_log import ROW_LOG, read_row_log


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    db = tmp_path / "shop" / "shop.sqlite"
    db.parent.mkdir()
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "x"), (2, "y"), (3, "z")])
    questions = [{"question": f"q{i}", "query": f"SELECT a FROM t WHERE a = {i}", "db_id": "shop"}
                 for i in range(1, 6)]
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(questions))
    return path


def _run(out: Path, dataset: Path, **kw):
    return eval_command(out=out, mode="gold", dataset=str(dataset), db_dir=dataset.parent, **kw)


class _KilledAfter(Exception):
    pass


def test_a_killed_run_keeps_its_rows_and_resume_finishes_it(tmp_path: Path, dataset: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    real_score = eval_cli.run_eval.__globals__["score_question"]
    calls: list[int] = []

    def dies_on_the_fourth(question, *args):
        if len(calls) == 3:
            raise _KilledAfter()  # as if the process were killed before the fourth answer
        calls.append(question.index)
        return real_score(question, *args)

    monkeypatch.setitem(eval_cli.run_eval.__globals__, "score_question", dies_on_the_fourth)
    with pytest.raises(_KilledAfter):
        _run(out, dataset)
    assert not (out / "eval.json").exists()
    logged = read_row_log(out)
    assert logged is not None and sorted(logged.rows) == [0, 1, 2] and not logged.finished

    # a fresh run into the folder would throw the three answers away: refused, typed
    with pytest.raises(ConfigError, match="--resume"):
        _run(out, dataset)
    # a resume with other settings would mix two configurations: refused, naming what differs
    with pytest.raises(ConfigError, match="rules"):
        _run(out, dataset, rules="spider-official", resume=True)

    monkeypatch.setitem(eval_cli.run_eval.__globals__, "score_question", real_score)
    seen: list[int] = []
    monkeypatch.setitem(eval_cli.run_eval.__globals__, "score_question",
                        lambda q, *a: (seen.append(q.index), real_score(q, *a))[1])
    summary = _run(out, dataset, resume=True)
    assert seen == [3, 4]  # only the questions the log lacked
    assert summary["n"] == 5 and summary["num_correct"] == 5
    assert summary["config"]["segments"] == 2 and summary["config"]["resumed_rows"] == 3
    rows = json.loads((out / "eval.json").read_text())["questions"]
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert read_row_log(out).finished
    # a finished log does not block a new run into the same folder
    again = _run(out, dataset)
    assert again["config"]["segments"] == 1 and again["config"]["resumed_rows"] == 0


def test_a_line_cut_off_mid_write_is_ignored_and_garbage_is_refused(tmp_path: Path, dataset: Path) -> None:
    out = tmp_path / "run"
    _run(out, dataset)
    lines = (out / ROW_LOG).read_text().splitlines()
    # the process died while writing the fourth row: three whole rows and half a line
    (out / ROW_LOG).write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])
    logged = read_row_log(out)
    assert sorted(logged.rows) == [0, 1, 2] and not logged.finished
    assert _run(out, dataset, resume=True)["config"]["resumed_rows"] == 3

    (out / ROW_LOG).write_text("not a log\n")
    with pytest.raises(DatasetError, match="not a headstart row log"):
        _run(out, dataset, resume=True)
