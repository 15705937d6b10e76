"""`headstart loadtest`: the scenario files, the report, and a short `steady`
run of real Locust against the real local stack (Ray Serve, random:tiny) with
0 failures (what CI runs)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.memory import memory_trend, replica_pids, rss_mib
from loadtest.report import summarize
from loadtest.run import SCENARIO_DIR, run_time_s, scenario_defaults, scenario_path
from loadtest.settings import LoadSettings

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["steady", "burst", "mixed", "soak"])
def test_every_scenario_file_has_literal_defaults(name):
    defaults = scenario_defaults(scenario_path(name))
    assert {"users", "spawn_rate", "run_time", "max_sessions"} <= set(defaults)
    assert run_time_s(defaults["run_time"]) > 0
    assert "class " in (SCENARIO_DIR / f"{name}.py").read_text()


def test_bad_scenario_and_run_time_are_refused_with_the_valid_choices():
    with pytest.raises(ValueError, match="steady"):
        scenario_path("nope")
    with pytest.raises(ValueError, match="bad --time"):
        run_time_s("10 minutes")
    assert run_time_s("1h2m3s") == 3723 and run_time_s("90") == 90


def test_settings_travel_through_the_environment():
    settings = LoadSettings(grpc_target="h:1", tokens=["a", "b"], dbs=["world_1"], max_new_tokens=7, wpm=33.0,
                            seed=5, samples_path="/x")
    assert LoadSettings.from_env(settings.to_env()) == settings
    assert LoadSettings.from_env({}) == LoadSettings()


def test_summary_counts_rejections_failures_and_timeouts_apart():
    samples = [{"user": "ws_typist", "name": "ttft", "ms": float(ms), "length": 3, "error": None}
               for ms in range(1, 101)]
    samples += [{"user": "ws_typist", "name": "rejected", "ms": 2.0, "length": 0, "error": None},
                {"user": "ws_typist", "name": "ttft", "ms": 9e4, "length": 0, "error": "TimeoutError"},
                {"user": "grpc_typist", "name": "open", "ms": 1.0, "length": 0, "error": "ApiError"}]
    s = summarize(samples)
    ws = s["ws_typist"]
    assert (ws["num_answers"], ws["num_rejected"], ws["num_failures"], ws["num_timeouts"]) == (100, 1, 1, 1)
    assert ws["ttft_p50_ms"] == 50.5 and ws["computed_at_submit_mean"] == 3
    assert s["grpc_typist"]["failures_by_kind"] == {"open:ApiError": 1}


def test_memory_trend_tells_flat_from_growing():
    flat = [{"t_s": i, "gateway_mib": 500.0 + (i % 3), "replicas_mib": {"1": 900.0}} for i in range(40)]
    assert memory_trend(flat)["gateway"]["flat"] and memory_trend(flat)["replicas"]["flat"]
    growing = [{"t_s": i, "gateway_mib": 500.0, "replicas_mib": {"1": 900.0 + 10 * i}} for i in range(40)]
    trend = memory_trend(growing)
    assert trend["gateway"]["flat"] and not trend["replicas"]["flat"]
    assert memory_trend(flat[:3])["verdict"] == "too few samples"
    assert rss_mib(1 << 30) is None and rss_mib(os.getpid()) > 0
    for pid in replica_pids():  # only engine replicas (a Serve stack of this test session may be up)
        assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ServeReplica")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_steady_run_has_no_failures(tmp_path):
    """8 typists (WebSocket and gRPC, 3 tenants, 4 databases) for 40 s on random:tiny."""
    # NOTE: find_spec, not importorskip: importing locust monkey-patches this process with gevent.
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed (pip install -e .[loadtest])")
    out = tmp_path / "steady"
    # NOTE: a run directory of its own: Ray's temp files (and so its cluster)
    # must not be shared with a stack that this checkout is running already.
    env = {**os.environ, "HEADSTART_HOME": str(tmp_path / "home")}
    log = tmp_path / "loadtest.log"
    # NOTE: output to a file, not a pipe: a Ray helper process that outlives the
    # command would hold a pipe open and keep `run` waiting for its end.
    with log.open("w") as sink:
        proc = subprocess.run([sys.executable, "-m", "headstart.cli", "loadtest", "steady", "--model", "random:tiny",
                               "--users", "8", "--time", "40s", "--out", str(out), "--max-new-tokens", "8"],
                              cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=540)
    assert proc.returncode == 0, log.read_text()[-4000:]
    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader((out / "locust_stats.csv").open())}
    assert rows[("", "Aggregated")]["Failure Count"] == "0"
    for user in ("ws_typist", "grpc_typist"):
        assert int(rows[(user, "ttft")]["Request Count"]) > 0, rows.keys()
        assert int(rows[(user, "keystroke_rtt")]["Request Count"]) > 0
    assert list(csv.DictReader((out / "locust_failures.csv").open())) == []
    report = json.loads((out / "loadtest.json").read_text())
    for user in ("ws_typist", "grpc_typist"):
        s = report["users"][user]
        assert s["num_failures"] == 0 and s["num_answers"] > 0 and s["ttft_p50_ms"] > 0
    assert report["memory"] and report["memory"][0]["replicas_mib"], "the replica's memory was sampled"
    assert "TTFT p50 ms" in (out / "loadtest.md").read_text()
    assert (out / "loadtest.png").stat().st_size > 0 and (out / "locust.html").stat().st_size > 0
