"""`headstart loadtest`: the scenario files, the report, the data users' rows,
push clocks and SSE parsing, and short runs of real Locust against the real
local stack (Ray Serve, random:tiny, Redis): `steady` with 0 failures (what CI
runs) and `mixed` with its data producer and flash subscriber."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.data import FIRST_ROW_NUMBER, PushClock, RowTemplate, SseParser
from loadtest.memory import memory_trend, replica_pids, rss_mib
from loadtest.report import data_table_rows, summarize, table_rows
from loadtest.run import SCENARIO_DIR, run_time_s, scenario_defaults, scenario_path
from loadtest.settings import DEFAULT_DATA_ROW, LoadSettings

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
                            seed=5, samples_path="/x", data_db="pets_1", data_rows_per_push=3,
                            data_push_interval_s=0.5, flash_question="How many pets, really?",
                            data_row='{"table": "Pets", "values": {"PetID": "{n}", "weight": "{r}"}}')
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


def test_mixed_scenario_has_the_data_users():
    text = (SCENARIO_DIR / "mixed.py").read_text()
    assert all(f"users.{c}" in text for c in ("DataProducer", "GrpcDataProducer", "FlashSubscriber"))


def test_row_template_counts_up_and_fills_random_numbers():
    template = RowTemplate('{"table": "t", "values": {"id": "{n}", "name": "row {n}", "v": "{r}", "k": "x"}}',
                           seed=1)
    rows = template.rows(3)
    assert [r["values"]["id"] for r in rows] == [FIRST_ROW_NUMBER, FIRST_ROW_NUMBER + 1, FIRST_ROW_NUMBER + 2]
    assert rows[1]["values"]["name"] == f"row {FIRST_ROW_NUMBER + 1}" and rows[1]["values"]["k"] == "x"
    assert all(isinstance(r["values"]["v"], float) and 0 <= r["values"]["v"] <= 100 for r in rows)
    assert template.rows(1)[0]["values"]["id"] == FIRST_ROW_NUMBER + 3  # the numbers go on across pushes
    two = RowTemplate('[{"table": "a", "values": {}}, {"table": "b", "values": {}}]').rows(3)
    assert [r["table"] for r in two] == ["a", "b", "a"]
    assert RowTemplate(DEFAULT_DATA_ROW).rows(1)[0]["table"] == "city"
    for bad in ("not json", "[]", '{"values": {}}'):
        with pytest.raises(ValueError, match="template"):
            RowTemplate(bad)


def test_push_clock_completes_each_push_once_from_its_own_ack():
    clock = PushClock()
    clock.acked(5, 1.0)
    clock.acked(9, 2.0)
    clock.acked(12, 3.0)
    assert clock.reached(4) == []  # a version before the push holds none of its rows
    assert clock.reached(10) == [1.0, 2.0]  # one batch (or a skipped version) completes both
    assert clock.reached(10) == [] and len(clock) == 1
    clock.acked(15, 9.0)
    assert clock.expired(before=5.0) == [3.0] and len(clock) == 1
    assert clock.reached(15) == [9.0] and len(clock) == 0


def test_sse_parser_reads_the_gateways_frames_and_keeps_the_last_id():
    parser = SseParser()
    text = (": subscribed\n\n"
            "id: 1-0\nevent: data_updated\ndata: {\"version\": 3, \"rows_added\": 3}\n\n"
            ": keep-alive\n\n"
            "id: 2-0\r\nevent: flash_ready\r\ndata: {\"id\": \"q1\",\r\ndata: \"version\": 3}\r\n\r\n")
    events = [e for e in map(parser.feed, text.replace("\r\n", "\n").split("\n")) if e is not None]
    assert [(e.id, e.kind, e.payload) for e in events] == [
        ("1-0", "data_updated", {"version": 3, "rows_added": 3}), ("2-0", "flash_ready", {"id": "q1", "version": 3})]
    assert parser.last_id == "2-0"
    assert parser.feed("data: {}\r") is None and parser.feed("").kind == "message"


def test_summary_puts_data_users_in_a_table_of_their_own():
    samples = [{"user": "data_producer", "name": "open", "ms": 900.0, "length": 0, "error": None}]
    samples += [{"user": "data_producer", "name": "push", "ms": float(ms), "length": 5, "error": None}
                for ms in range(1, 11)]
    samples += [{"user": "flash_subscriber", "name": "push", "ms": 4.0, "length": 5, "error": None},
                {"user": "flash_subscriber", "name": "data_updated", "ms": 40.0, "length": 5, "error": None},
                {"user": "flash_subscriber", "name": "flash_ready", "ms": 400.0, "length": 5, "error": None},
                {"user": "flash_subscriber", "name": "flash_ready", "ms": 9e4, "length": 0, "error": "TimeoutError"},
                {"user": "ws_typist", "name": "ttft", "ms": 50.0, "length": 3, "error": None}]
    s = summarize(samples)
    p, f = s["data_producer"], s["flash_subscriber"]
    assert (p["num_opened"], p["num_pushes"], p["num_rows_pushed"], p["push_p50_ms"]) == (1, 10, 50, 5.5)
    assert p["num_flash_answers"] == 0 and p["flash_ready_p50_ms"] is None
    assert (f["data_updated_p50_ms"], f["flash_ready_p50_ms"], f["num_flash_answers"]) == (40.0, 400.0, 1)
    assert (f["num_failures"], f["num_timeouts"]) == (1, 1)
    assert [r[0] for r in table_rows(s)] == ["ws_typist"]
    assert [r[0] for r in data_table_rows(s)] == ["data_producer", "flash_subscriber"]
    assert "is_data_user" not in s["ws_typist"]


def test_memory_trend_tells_flat_from_growing():
    flat = [{"t_s": i, "gateway_mib": 500.0 + (i % 3), "replicas_mib": {"1": 900.0}} for i in range(40)]
    assert memory_trend(flat)["gateway"]["flat"] and memory_trend(flat)["replicas"]["flat"]
    growing = [{"t_s": i, "gateway_mib": 500.0, "replicas_mib": {"1": 900.0 + 10 * i}} for i in range(40)]
    trend = memory_trend(growing)
    assert trend["gateway"]["flat"] and not trend["replicas"]["flat"]
    assert trend["replicas"]["growing"] and not trend["gateway"]["growing"]
    falling = [{"t_s": i, "gateway_mib": 500.0, "replicas_mib": {"1": 5000.0 - 50 * i}} for i in range(40)]
    trend = memory_trend(falling)  # the start-up peak given back: not flat, not growing either
    assert not trend["replicas"]["flat"] and not trend["replicas"]["growing"]
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
    assert proc.returncode == 0, log.read_text()[-4000:] + _engine_warnings(tmp_path / "home")
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
    probes = [m["replica_probe"] for m in report["memory"] if "replica_probe" in m]
    assert probes and probes[0]["heap_in_use_mib"] > 0 and probes[0]["gc_objects"] > 0, probes[:2]
    assert "TTFT p50 ms" in (out / "loadtest.md").read_text()
    assert (out / "loadtest.png").stat().st_size > 0 and (out / "locust.html").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_mixed_run_pushes_rows_and_times_their_versions(tmp_path):
    """`mixed` for 45 s on random:tiny: the data producers' pushes (REST, gRPC) and the flash
    subscriber's ack→data_updated and ack→flash_ready (the local stack's flash worker)
    are recorded, with no failure anywhere, a noisy tenant at its limits included."""
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed (pip install -e .[loadtest])")
    out = _run_short_mixed(tmp_path, "mixed")
    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader((out / "locust_stats.csv").open())}
    assert rows[("", "Aggregated")]["Failure Count"] == "0", list(csv.DictReader((out / "locust_failures.csv").open()))
    for producer in ("data_producer", "grpc_data_producer"):
        assert int(rows[(producer, "push")]["Request Count"]) > 0, rows.keys()
    assert int(rows[("flash_subscriber", "data_updated")]["Request Count"]) > 0, rows.keys()
    # the noisy tenant's malformed requests were all refused with a 4xx (a failure otherwise, counted above)
    assert int(rows[("noisy", "bad_input_refused")]["Request Count"]) > 0, rows.keys()
    report = json.loads((out / "loadtest.json").read_text())
    producer, subscriber = report["users"]["data_producer"], report["users"]["flash_subscriber"]
    assert producer["num_rows_pushed"] == 5 * producer["num_pushes"] > 0
    assert subscriber["data_updated_p50_ms"] > 0
    assert subscriber["num_flash_answers"] > 0 and subscriber["flash_ready_p50_ms"] > 0
    assert "ack→flash_ready p50 ms" in (out / "loadtest.md").read_text()


def _run_short_mixed(tmp_path: Path, name: str, *more: str) -> Path:
    """`headstart loadtest mixed` for 45 s on random:tiny (5 users, world_1 and pets_1); its output
    folder, once it exited 0 (else the log and the engine's warnings fail the test)."""
    out = tmp_path / name
    env = {**os.environ, "HEADSTART_HOME": str(tmp_path / "home")}
    log = tmp_path / "loadtest.log"
    with log.open("w") as sink:
        proc = subprocess.run([sys.executable, "-m", "headstart.cli", "loadtest", "mixed", "--model", "random:tiny",
                               "--users", "5", "--time", "45s", "--out", str(out), "--max-new-tokens", "8",
                               "--db", "world_1", "--db", "pets_1", "--flash-push-interval", "3", *more],
                              cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=540)
    assert proc.returncode == 0, log.read_text()[-4000:] + _engine_warnings(tmp_path / "home")
    return out


def _engine_warnings(home: Path) -> str:
    """What the run's Ray processes logged as warnings or errors (a failed run's message:
    e.g. why a replica could not load a database, which its client sees only as UNAVAILABLE)."""
    lines = []
    for path in sorted(home.glob("ray/session_*/logs/**/*")):
        if path.is_file() and path.suffix in (".log", ".err", ".out"):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            lines += [f"{path.name}: {line}" for line in text.splitlines()
                      if "WARNING" in line or "ERROR" in line or "Error" in line or "failed to load" in line]
    return "\n--- engine warnings ---\n" + "\n".join(lines[-60:])


def test_faults_are_checked_and_need_the_local_stack():
    from loadtest.run import _check_faults

    _check_faults(["redis-restart"], None)
    with pytest.raises(ValueError, match="valid: redis-restart"):
        _check_faults(["disk-full"], None)
    with pytest.raises(ValueError, match="drop --host"):
        _check_faults(["redis-restart"], "http://gateway:8080")


def test_every_failed_request_must_carry_an_api_code():
    from loadtest.faults import acked_rows, typed_errors

    samples = [{"user": "data_producer", "name": "push", "error": None, "code": None},
               {"user": "data_producer", "name": "push", "error": "ApiError", "code": "UNAVAILABLE"},
               {"user": "flash_subscriber", "name": "subscribe", "error": "ConnectionError", "code": None},
               {"user": "rest_complete", "name": "last_token", "error": "ApiError", "code": "502"},
               {"user": "grpc_typist", "name": "ttft", "error": "TimeoutError", "code": None}]
    got = typed_errors(samples)
    assert (got["errors"], got["untyped"]) == (4, 3)
    assert got["by_code"] == {"502": 1, "ConnectionError": 1, "TimeoutError": 1, "UNAVAILABLE": 1}
    assert acked_rows(Path("/nonexistent")) == {}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_mixed_run_survives_a_redis_restart(tmp_path):
    """`mixed --faults redis-restart` for 45 s on random:tiny: the stack's Redis is killed halfway and
    kept down 4 s; no acknowledged row is lost and every failed request has an API code (issue 29)."""
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed (pip install -e .[loadtest])")
    out = _run_short_mixed(tmp_path, "faults", "--faults", "redis-restart", "--fault-down-s", "4")
    faults = json.loads((out / "loadtest.json").read_text())["meta"]["faults"]
    (restart,) = faults["injected"]
    assert restart["restarted"] and restart["back_at_s"] - restart["killed_at_s"] >= 4
    assert faults["acked"]["acked_rows"] > 0 and faults["acked"]["lost_rows"] == 0
    assert faults["acked"]["sessions"] == 3 and not faults["acked"]["sessions_behind"]
    assert faults["errors"]["untyped"] == 0 and faults["errors"]["errors"] > 0  # the outage was seen, typed
    assert set(faults["errors"]["by_code"]) == {"UNAVAILABLE"}
    assert "acknowledged rows lost: 0 of" in (out / "loadtest.md").read_text()
