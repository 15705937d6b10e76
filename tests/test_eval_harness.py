"""The run loop and its summary, on a crafted database with a scripted generator."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from headstart.eval.compare import get_rule
from headstart.eval.executors.sqlite import SqliteExecutor
from headstart.eval.harness import run_eval
from headstart.eval.records import EvalQuestion, Generation
from headstart.eval.summary import summarize


class ScriptedGenerator:
    """A fake serving path (a unit test of the loop's logic): answers from a script by index."""

    mode = "scripted"

    def __init__(self, script: dict[int, tuple[str | Exception, float | None]]) -> None:
        self.script = script
        self.warmups: list[int] = []
        self.calls: list[int] = []

    def warmup(self, question: EvalQuestion) -> None:
        self.warmups.append(question.index)

    def generate(self, question: EvalQuestion) -> Generation:
        self.calls.append(question.index)
        answer, ttft = self.script[question.index]
        if isinstance(answer, Exception):
            raise answer
        return Generation(answer, ttft, {"k": question.index})

    def close(self) -> None:
        return None


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    path = tmp_path / "shop" / "shop.sqlite"
    path.parent.mkdir()
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "x"), (2, "y"), (3, "z")])
    conn.commit()
    conn.close()
    return path


# index: (gold SQL, scripted answer, ttft) -> expected (status, correct, exact, pred_error_code)
SCRIPT = {
    0: ("SELECT a FROM t ORDER BY a", "```sql\nSELECT a FROM t ORDER BY a;\n```", 10.0, ("scored", True, True, None)),
    1: ("SELECT count(*) FROM t", "SELECT COUNT(*) FROM T", 20.0, ("scored", True, True, None)),
    2: ('SELECT b FROM t WHERE a = 1', "SELECT b FROM t WHERE a = 2", 30.0, ("scored", False, False, None)),
    3: ("SELECT a FROM t", "DROP TABLE t", 40.0, ("scored", False, False, "denied")),
    4: ("SELECT a FROM t", RuntimeError("engine fell over"), None, ("scored", False, False, "generation_error")),
    5: ("SELECT nope FROM t", "SELECT 1", 50.0, ("gold_error", None, None, None)),
    6: ("SELECT a FROM t", "SELECT a FROM t", 60.0, ("skipped", None, None, None)),
    7: ("SELECT a FROM t", "SELECT a FROM t ORDER BY a DESC", 50.0, ("scored", True, False, None)),
    8: ('SELECT a FROM t WHERE b = "y"', "SELECT a FROM t WHERE b = 'y'", None, ("scored", True, True, None)),
}


def questions(shop: Path) -> list[EvalQuestion]:
    out = []
    for index, (gold, _, _, _) in SCRIPT.items():
        missing = index == 6
        out.append(EvalQuestion(
            index=index, question_id=str(index), db_id="shop", question=f"q{index}", gold_sql=gold,
            db_path=None if missing else shop, skip_reason="database file missing: x" if missing else None,
        ))
    return out


def test_rows_and_summary(shop: Path) -> None:
    generator = ScriptedGenerator({i: (answer, ttft) for i, (_, answer, ttft, _) in SCRIPT.items()})
    executor = SqliteExecutor()
    seen = []
    rows = run_eval(questions(shop), generator, executor, get_rule("spider"), on_row=lambda r: seen.append(r.index))
    executor.close()
    got = {r.index: (r.status, r.correct, r.exact, r.pred_error_code) for r in rows}
    assert got == {i: expected for i, (_, _, _, expected) in SCRIPT.items()}
    assert seen == list(SCRIPT)
    assert generator.warmups == [0]
    assert generator.calls == [0, 1, 2, 3, 4, 7, 8]  # no generation for a gold error or a skip
    assert rows[0].pred_sql == "SELECT a FROM t ORDER BY a"
    assert rows[0].extra == {"k": 0}
    assert rows[4].pred_error == "RuntimeError: engine fell over"
    assert rows[5].gold_error.startswith("sql_error: OperationalError: no such column: nope")

    summary = summarize(rows)
    assert {k: summary[k] for k in ("total", "n", "skipped", "gold_errors", "num_correct", "num_exact", "num_ttft")} == {
        "total": 9, "n": 7, "skipped": 1, "gold_errors": 1, "num_correct": 4, "num_exact": 3, "num_ttft": 5,
    }
    assert summary["execution_accuracy"] == pytest.approx(4 / 7)
    assert summary["ttft_p50_ms"] == 30.0  # of 10, 20, 30, 40, 50
    assert summary["pred_error_codes"] == {"denied": 1, "generation_error": 1}
    assert summary["skip_reasons"] == {"database file missing: x": 1}
    lo, hi = summary["execution_accuracy_ci95"]
    assert lo < 4 / 7 < hi
