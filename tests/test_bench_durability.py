"""`headstart bench durability`: its files and fields, from the command line (timings are not
asserted: benchmarks are not tests), and its refusal of bad counts."""

from __future__ import annotations

import json

import pytest

from tests.redis_fixture import redis_binary_or_skip
from tests.test_cli import run


def test_bench_durability_plumbing(tmp_path):
    redis_binary_or_skip()
    out = tmp_path / "out"
    proc = run(["bench", "durability", "--pushers", "1,2", "--rounds", "2", "--pushes", "5", "--rows", "3",
                "--dir", str(tmp_path), "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "durability.json").read_text())
    got = {(r["pushers"], r["appendfsync"]): r for r in report["results"]}
    assert set(got) == {(n, p) for n in (1, 2) for p in ("everysec", "always")}
    assert all(r["pushes"] == 2 * 5 * r["pushers"] and r["p99_ms"] >= r["p50_ms"] > 0 for r in got.values())
    assert "| pushers | appendfsync |" in (out / "durability.md").read_text()
    assert (out / "durability.png").stat().st_size > 0 and "everysec" in proc.stdout


def test_bench_durability_refuses_bad_counts(tmp_path):
    from bench.durability import run_durability_bench

    with pytest.raises(ValueError, match="rounds"):
        run_durability_bench(tmp_path, [1], 0, 5, 3)
