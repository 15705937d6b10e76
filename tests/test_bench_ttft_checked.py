"""`bench ttft --candidates`: the checked_* statistics a mode reports."""

from __future__ import annotations

from bench import ttft_checked


def test_mode_stats_from_rows():
    rows = [{"total_ms": 100.0, "checked_ms": 150.0, "checked_index": 0, "checked_candidates": 8, "checked_agreed": 5},
            {"total_ms": 200.0, "checked_ms": 260.0, "checked_index": 3, "checked_candidates": 6, "checked_agreed": 0}]
    stats = ttft_checked.mode_stats(rows)
    assert stats["checked_changed_rate"] == 0.5 and stats["checked_candidates_mean"] == 7
    assert stats["checked_all_failed"] == 1
    assert stats["checked_p50_ms"] >= 150.0 and stats["checked_p99_ms"] <= 260.0
    assert len(ttft_checked.table_cells(stats)) == len(ttft_checked.HEADER)
    assert ttft_checked.mode_stats([{"total_ms": 1.0}]) == {} and ttft_checked.table_cells({}) == []


def test_row_fields_keep_only_checked():
    assert ttft_checked.row_fields({"checked_ms": 1.0, "decode_forwards": 3}) == {"checked_ms": 1.0}
    assert ttft_checked.candidate_params(1, False, 0) is None
    assert ttft_checked.candidate_params(4, True, 2).wait_all
