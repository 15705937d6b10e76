"""The table-cache commands, run as a user runs them (subprocess, random:tiny)."""

from __future__ import annotations

import json

import pytest

from headstart.typist import Typist
from tests.test_cli import run


def test_precompute_into_redis_then_skip(tmp_path, redis_url):
    args = ["tables", "precompute", "--db", "concert_singer", "flight_2", "--model", "random:tiny",
            "--dtype", "float64", "--store", redis_url, "--table-cache", "independent"]
    first = run(args, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "concert_singer: 4 tables in 4 groups; encoded 4 groups" in first.stdout
    assert "flight_2: 3 tables in 3 groups; encoded 3 groups" in first.stdout
    again = run(args, tmp_path)
    assert "encoded 0 groups (0 tokens, 0.0 MiB), skipped 4 already stored" in again.stdout
    assert "group" in again.stderr  # the progress bar


@pytest.mark.parametrize("args,message", [
    (["--table-cache", "off"], "valid: pfk, independent"),
    (["--store", "ftp://x"], "unknown block store scheme 'ftp'"),
    (["--store", "redis://127.0.0.1:1/0"], "redis"),
    (["--db", "no_such_db"], "cannot resolve database"),
])
def test_precompute_errors_are_clear(tmp_path, args, message):
    base = ["tables", "precompute", "--model", "random:tiny"]
    proc = run(base + (args if "--db" in args else ["--db", "singer", *args]), tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("table_cache,rc", [("pfk", 0), ("independent", 0), ("warp", 2)])
def test_replay_takes_a_table_cache_mode(tmp_path, table_cache, rc):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(Typist(wpm=3000, seed=1).trace("How many singers are there?").to_jsonl())
    out = tmp_path / "out.json"
    proc = run(["replay", "--model", "random:tiny", "--dtype", "float64", "--db", "concert_singer", "--trace",
                str(trace), "--max-new-tokens", "4", "--table-cache", table_cache, "--json", str(out)], tmp_path)
    assert proc.returncode == rc, proc.stderr
    if rc:
        assert "table_cache" in proc.stderr and "Traceback" not in proc.stderr
    else:
        assert json.loads(out.read_text())["table_cache"] == table_cache


def test_bench_tables_plumbing(tmp_path):
    """The benchmark's files and fields (timings are not asserted: benchmarks are not tests)."""
    out = tmp_path / "tables"
    proc = run(["bench", "tables", "--model", "random:tiny", "--questions", "3", "--guard-questions", "1",
                "--guard-tokens", "3", "--store", "memory://", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "tables.json").read_text())
    assert set(report["modes"]) == {"cold", "prefix", "pfk", "independent"}
    for stats in report["modes"].values():
        assert {"total_ttft_s", "p50_ms", "p99_ms", "hit_rate"} <= set(stats) and stats["num_requests"] == 3
    assert set(report["ablations"]) == {"lru", "lfu", "fifo", "no_device_tier", "no_rerank", "no_pipeline"}
    assert report["ablations"]["no_device_tier"]["device_hit_rate"] == 0.0
    guard = report["accuracy_guard"]
    assert guard["num_questions"] == 1 and {"pfk", "independent"} <= set(guard)
    assert {"top1_agreement_mean", "kl_first_token_mean"} <= set(guard["pfk"])
    assert report["modes"]["pfk"]["hit_rate"] > 0.8 and report["modes"]["cold"]["hit_rate"] == 0.0
    assert (out / "tables.md").read_text().count("\n|") >= 12 and (out / "tables.png").stat().st_size > 1000
