"""`bench ttft --candidates`: the checked_* statistics a mode reports."""

from __future__ import annotations

from bench import ttft_checked


def test_mode_stats_from_rows():
    rows = [{"total_ms": 100.0, "checked_ms": 150.0, "checked_index": 0, "checked_candidates": 8, "checked_agreed": 5,
             "checked_ready_at_enter": True},
            {"total_ms": 200.0, "checked_ms": 260.0, "checked_index": 3, "checked_candidates": 6, "checked_agreed": 0,
             "checked_ready_at_enter": False}]
    stats = ttft_checked.mode_stats(rows)
    assert stats["checked_changed_rate"] == 0.5 and stats["checked_candidates_mean"] == 7
    assert stats["checked_all_failed"] == 1 and stats["checked_ready_at_enter_rate"] == 0.5
    ttft_checked.vs_peer(stats, 2 * stats["checked_p50_ms"])
    assert stats["checked_p50_vs_llamacpp"] == 0.5 and ttft_checked.table_cells(stats)[-1] == "0.500"
    assert stats["checked_p50_ms"] >= 150.0 and stats["checked_p99_ms"] <= 260.0
    assert len(ttft_checked.table_cells(stats)) == len(ttft_checked.HEADER)
    assert ttft_checked.mode_stats([{"total_ms": 1.0}]) == {} and ttft_checked.table_cells({}) == []


def test_row_fields_keep_only_checked():
    assert ttft_checked.row_fields({"checked_ms": 1.0, "decode_forwards": 3}) == {"checked_ms": 1.0}
    # every candidate ended before Enter (the pause decoded them) or not
    for ready, k, at_enter in ((8, 8, True), (3, 8, False)):
        fields = ttft_checked.row_fields({"checked_ms": 1.0, "candidates_ready_at_submit": ready, "candidates_k": k})
        assert fields == {"checked_ms": 1.0, "checked_ready_at_enter": at_enter}
    assert ttft_checked.candidate_params(1, False, 0) is None
    assert ttft_checked.candidate_params(4, True, 2).wait_all
