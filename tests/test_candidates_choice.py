"""Execution-checked choice: result keys, the read-only runner, and the rule that picks."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from pathlib import Path

import pytest

from headstart.candidates import Candidate, CandidateLimits, CandidateRunner, RunOutcome, choose, result_key
from headstart.eval.candidate_vote import winning_key
from headstart.eval.records import ResultSet


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "shop.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL);
        INSERT INTO item VALUES (1, 'pen', 1.5), (2, 'ink', 3.0), (3, 'pad', 3.0);
    """)
    conn.commit()
    conn.close()
    return path


@pytest.fixture
def runner():
    r = CandidateRunner(CandidateLimits(timeout_s=2.0, row_limit=1000, display_rows=2))
    yield r
    r.close()


def outcome(index: int, key: str | None) -> RunOutcome:
    return RunOutcome(index, f"sql{index}", key, error_code=None if key else "sql_error", error="" if key else "boom")


# -- result keys ------------------------------------------------------------------


def test_key_ignores_row_and_column_order_and_float_noise():
    a = ResultSet(("x", "y"), ((1, "a"), (2, "b")))
    b = ResultSet(("y", "x"), (("b", 2), ("a", 1)))
    c = ResultSet(("x", "y"), ((1.0000000000001, "a"), (2, "b")))
    assert result_key(a) == result_key(b) == result_key(c)


def test_key_tells_different_results_apart():
    base = ResultSet(("x",), ((1,), (2,)))
    assert result_key(base) != result_key(ResultSet(("x",), ((1,), (3,))))
    assert result_key(base) != result_key(ResultSet(("x",), ((1,), (2,), (2,))))  # a multiset: duplicates count
    assert result_key(ResultSet(("x",), ())) == result_key(ResultSet(("y", "z"), ()))  # empty equals empty


def test_key_orders_mixed_types_without_error():
    assert result_key(ResultSet(("v",), ((None,), ("a",), (1,), (b"\x00",))))


# -- the rule ----------------------------------------------------------------------


def test_largest_group_wins():
    choice = choose([outcome(0, "A"), outcome(1, "B"), outcome(2, "B"), outcome(3, "A"), outcome(4, "B")])
    assert (choice.index, choice.agreed, choice.failed) == (1, 3, ())
    assert choice.changed


def test_tie_goes_to_the_greedy_group():
    choice = choose([outcome(0, "A"), outcome(1, "B"), outcome(2, "B"), outcome(3, "A")])
    assert (choice.index, choice.agreed) == (0, 2)
    assert not choice.changed


def test_failed_sql_never_wins_while_another_runs():
    choice = choose([outcome(0, None), outcome(1, None), outcome(2, None), outcome(3, "C")])
    assert (choice.index, choice.agreed, choice.failed, choice.error) == (3, 1, (0, 1, 2), None)


def test_all_failed_keeps_the_greedy_answer_with_its_error():
    choice = choose([outcome(0, None), outcome(1, None)])
    assert (choice.index, choice.sql, choice.agreed, choice.error) == (0, "sql0", 0, "boom")


def test_tie_without_the_greedy_goes_to_the_lowest_index():
    assert winning_key([None, "B", "C", "C", "B"]) == "B"
    assert choose([outcome(0, None), outcome(2, "C"), outcome(1, "B")]).index == 1


def test_choose_needs_the_greedy_outcome():
    with pytest.raises(ValueError):
        choose([outcome(1, "A")])
    with pytest.raises(ValueError):
        choose([])


# -- the runner -------------------------------------------------------------------


def test_runner_groups_equal_results_and_keeps_the_first_rows(db, runner):
    candidates = [
        Candidate(0, "", "SELECT name FROM item WHERE price > 2"),
        Candidate(1, "", "SELECT name FROM item WHERE price >= 3 ORDER BY id DESC"),
        Candidate(2, "", "SELECT nme FROM item"),
        Candidate(3, "", "SELECT name FROM item"),
    ]
    outcomes = runner.run(db, candidates)
    assert [o.ok for o in outcomes] == [True, True, False, True]
    assert outcomes[0].key == outcomes[1].key != outcomes[3].key
    assert outcomes[3].num_rows == 3 and len(outcomes[3].rows) == 2  # display_rows=2
    assert outcomes[2].error_code == "sql_error"
    choice = runner.check(db, candidates).result(timeout=10)
    assert (choice.index, choice.agreed, choice.failed) == (0, 2, (2,))
    assert choice.columns == ("name",) and sorted(r[0] for r in choice.rows) == ["ink", "pad"]


def test_runner_never_writes(db, runner):
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    outcomes = runner.run(db, [Candidate(0, "", "DELETE FROM item"), Candidate(1, "", "DROP TABLE item"),
                               Candidate(2, "", "SELECT 1; DELETE FROM item")])
    assert not any(o.ok for o in outcomes)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_runner_stops_a_runaway_query(db):
    slow = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) "
            "SELECT count(*) FROM n a, n b, n c")
    runner = CandidateRunner(CandidateLimits(timeout_s=0.3))
    try:
        [out] = runner.run(db, [Candidate(0, "", slow)])
    finally:
        runner.close()
    assert out.error_code == "timeout"


def test_runner_caps_rows(db):
    runner = CandidateRunner(CandidateLimits(row_limit=2))
    try:
        [out] = runner.run(db, [Candidate(0, "", "SELECT * FROM item")])
    finally:
        runner.close()
    assert out.error_code == "row_limit" and not out.ok


def test_check_runs_off_the_calling_thread(db, runner):
    seen = []
    original = runner._run_all

    def spy(path, candidates):
        seen.append(threading.current_thread())
        return original(path, candidates)

    runner._run_all = spy
    runner.check(db, [Candidate(0, "", "SELECT 1")]).result(timeout=10)
    assert seen and seen[0] is not threading.current_thread()


def test_unfinished_candidates_count_as_failed(db, runner):
    [out] = runner.run(db, [Candidate(0, "", "SELECT 1", finish_reason="cancelled")])
    assert out.error_code == "not_finished"


# -- a request's checked answer ---------------------------------------------------------


def test_checked_answer_of_an_engine_request(tiny_runtime):
    from headstart.candidates import CheckedAnswers
    from headstart.engine.requests.candidates import CandidateParams
    from headstart.engine.requests.generation import SamplingParams
    from headstart.paths import default_spider_dir

    if not (default_spider_dir() / "database" / "world_1" / "world_1.sqlite").is_file():
        pytest.skip("Spider's world_1 is not here")
    checked = CheckedAnswers()
    try:
        params = SamplingParams(max_new_tokens=6)
        request = tiny_runtime.start_complete("world_1", "How many cities?", "cold", params,
                                              candidates=CandidateParams(3, seed=1, wait_all=True))
        choice = checked.check("world_1", request).result(timeout=120)
        # a random model writes no SQL: every candidate fails, the greedy answer stands with its error
        assert (choice.num_candidates, choice.index, choice.agreed, choice.failed) == (3, 0, 0, (0, 1, 2))
        assert choice.error
        alone = tiny_runtime.start_complete("world_1", "How many cities?", "cold", params,
                                            candidates=CandidateParams(1))
        assert checked.check("world_1", alone).result(timeout=120).num_candidates == 1
    finally:
        checked.close()
