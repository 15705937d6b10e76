"""`bench/data_sessions.py` end to end at a tiny scale (random:tiny, float64):
its files, and the numbers it exists to show (rebuild exact, shift not)."""

from __future__ import annotations

import json

from bench.data_sessions import run_data_bench


def test_bench_data_writes_its_report_and_rebuild_is_exact(tmp_path):
    report = run_data_bench(tmp_path, model="random:tiny", dtype="float64", threads=1, steps=[0, 6], repeats=1, new_tokens=4,
                            retention_rows=24, retention_batch=6, bound=200,
                            answer_tokens=6)
    assert {p.name for p in tmp_path.iterdir()} >= {"data.json", "data.md", "data.png"}
    saved = json.loads((tmp_path / "data.json").read_text())
    assert [p["rows"] for p in saved["latency"]] == [0, 6]
    modes = report["retention"]["modes"]
    assert modes["rebuild"]["rebuilds"] >= 1 and modes["shift"]["shifts"] >= 1
    assert modes["rebuild"]["max_logit_diff"] < 1e-9 and modes["rebuild"]["greedy_match"] == 3
    assert modes["none"]["max_logit_diff"] < 1e-9
    # whole answers, scored: rebuild's equal a cold prefill's on every question; EX is counted per mode
    assert modes["rebuild"]["same_as_cold"] == modes["none"]["same_as_cold"] == modes["rebuild"]["accuracy_questions"]
    assert all(0 <= m["accuracy_right"] <= m["accuracy_questions"] for m in modes.values())
    assert modes["shift"]["max_logit_diff"] > 1e-6  # the approximation is measured, not hidden
    assert modes["shift"]["sliding_tokens"] <= 200 and modes["rebuild"]["sliding_tokens"] <= 200
    ready = report["ready_exit"]
    assert ready["queries"] == 3 * 4  # 3 questions after each of 4 batches
    for tau, scored in ready["thresholds"].items():
        assert 0 <= scored["text_errors"] <= scored["hits"] == round(scored["hit_rate"] * 12)
    assert "ready-position exit" in (tmp_path / "data.md").read_text()
