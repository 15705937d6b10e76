"""bench/serve.py's checked-answer figures: the time to the `choice` beside the greedy answer's,
summarized per row and tabled only when a run asked for candidates (logic only; the typists
themselves run against the real stack in `headstart bench serve --candidates K`)."""

from __future__ import annotations

from bench.serve import summarize, table
from bench.serve_typists import Sample, _submit_candidates

ROW_KEYS = {"mode": "anticipatory", "path": "ws", "n": 1}


def _sample(total: float, checked: float | None = None, changed: bool = False, error: str = "") -> Sample:
    s = Sample("ws", True, "q", ttft_ms=10.0, engine_ttft_ms=5.0, total_ms=total, client_total_ms=total,
               error=error)
    if checked is not None:
        s.checked_client_total_ms, s.checked_num_candidates, s.checked_agreed = checked, 4, 3
        s.checked_changed = changed
    return s


def test_rows_of_a_run_with_candidates_carry_the_checked_times():
    row = summarize([_sample(100.0, 150.0, changed=True), _sample(200.0, 260.0), _sample(50.0, error="X")], [])
    assert row["checked_client_total_p50_ms"] == 205.0
    assert 150.0 < row["checked_client_total_p99_ms"] <= 260.0
    assert row["checked_changed_share"] == 0.5 and row["checked_num_candidates_mean"] == 4.0
    text = table([{**ROW_KEYS, **row}])
    assert "| checked p50 ms |" in text and "| anticipatory | ws | 1 | 150.0 | 205.0 |" in text and "50% |" in text


def test_rows_without_candidates_have_no_checked_fields_or_table():
    row = summarize([_sample(100.0), _sample(120.0)], [])
    assert not [k for k in row if k.startswith("checked_")]
    assert "checked p50" not in table([{**ROW_KEYS, **row}])


def test_a_wait_all_run_submits_the_object_form_and_a_plain_run_the_count():
    assert _submit_candidates(8, True) == {"k": 8, "wait_all": True}
    assert _submit_candidates(8, False) == 8
    assert _submit_candidates(1, True) == 1  # one candidate: nothing to wait for
