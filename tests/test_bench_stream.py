"""`bench/stream.py` end to end at a tiny scale (random:tiny, float64, a real Redis):
its files and their shape, and the exactness it reports (no timing asserted)."""

from __future__ import annotations

import json

from bench.stream import MODES, run_stream_bench

SUMMARY = {"p50_ms", "p99_ms", "first_ms", "last_ms", "growth"}


def test_bench_stream_writes_its_report_and_the_stateful_answers_are_exact(tmp_path, redis_url):
    run_stream_bench(tmp_path, model="random:tiny", dtype="float64", threads=1, rows_start=4,
                              rows_per_iteration=3, iterations=3, new_tokens=4, shift_bound=60, redis_url=redis_url)
    assert {p.name for p in tmp_path.iterdir()} >= {"stream.json", "stream.md", "stream.png"}
    saved = json.loads((tmp_path / "stream.json").read_text())
    assert set(saved["modes"]) == set(MODES)
    for mode in MODES:
        assert set(saved["modes"][mode]) >= SUMMARY
        assert all(saved["modes"][mode][k] > 0 for k in SUMMARY)
    points = saved["iterations_detail"]
    assert [p["iteration"] for p in points] == [1, 2, 3]
    assert [p["rows"] for p in points] == [7, 10, 13]  # 4 at start, then 3 per iteration, none dropped
    assert points[0]["context_tokens"] < points[1]["context_tokens"] < points[2]["context_tokens"]
    assert saved["outputs_identical"] is True and saved["prefix_identical"] is True
    assert saved["flash_identical"] is True
    assert saved["rows_dropped"] == 0
    drift = saved["shift_drift"]
    assert drift["shifts"] >= 1 and drift["sliding_tokens"] <= 60
    assert drift["max_logit_diff"] > 1e-6  # shift's approximation is measured, not hidden
    assert isinstance(drift["greedy_match"], bool)
    text = (tmp_path / "stream.md").read_text()
    assert "outputs_identical" in text and "| 3 | 13 |" in text



def test_bench_stream_is_a_headstart_bench_command():
    from typer.testing import CliRunner

    from cli.app import app

    result = CliRunner().invoke(app, ["bench", "stream", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for flag in ("--rows-start", "--rows-per-iteration", "--iterations", "--new-tokens", "--model", "--dtype",
                 "--threads", "--out"):
        assert flag in result.output
