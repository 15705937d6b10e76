"""`headstart loadtest`: the scenario files, the report, the answer clock and
the open-loop schedule, the data users' rows, push clocks and SSE parsing, and
short runs of real Locust against the real local stack (Ray Serve,
random:tiny, Redis): `steady` with 0 failures (what CI runs), `mixed` with its
OpenAI streamer, data producer and flash subscriber, and `open` at a fixed rate."""

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
from loadtest.report import CSV_FIELDS, data_table_rows, table_rows, typing_rows, write_csv
from loadtest.run import SCENARIO_DIR, run_time_s, scenario_defaults, scenario_path
from loadtest.settings import DEFAULT_DATA_ROW, LoadSettings
from loadtest.summary import summarize
from loadtest.timing import AnswerClock, QuestionMaker, arrival_times, parse_length_sets

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["steady", "burst", "mixed", "soak", "open"])
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
                            data_row='{"table": "Pets", "values": {"PetID": "{n}", "weight": "{r}"}}',
                            rate=2.5, arrival="fixed", length_sets=["8:4", "64:32"], max_in_flight=9)
    assert LoadSettings.from_env(settings.to_env()) == settings
    assert LoadSettings.from_env({}) == LoadSettings()


def _answers(user: str, n: int, tokens: int = 10) -> list[dict]:
    """n answers of one class, 1 s apart, each with its ttft and itl metrics."""
    out = []
    for i in range(1, n + 1):
        out += [{"t": 1000.0 + i, "user": user, "name": "answer", "ms": 100.0 * i, "length": tokens, "error": None},
                {"t": 1000.0 + i, "user": user, "name": "ttft", "ms": float(i), "length": 3, "error": None,
                 "kind": "metric"},
                {"t": 1000.0 + i, "user": user, "name": "itl", "ms": None, "length": 0, "error": None,
                 "kind": "metric", "values": [10.0] * 8 + [50.0]}]
    return out


def test_summary_gives_rates_itl_and_counts_failures_apart():
    samples = _answers("ws_typist", 100)
    samples += [{"t": 1050.0, "user": "ws_typist", "name": "rejected", "ms": 2.0, "length": 0, "error": None},
                {"t": 1050.0, "user": "ws_typist", "name": "keystroke_rtt", "ms": 4.0, "length": 0, "error": None,
                 "kind": "metric"},
                {"t": 1090.0, "user": "ws_typist", "name": "answer", "ms": 9e4, "length": 0, "error": "TimeoutError"},
                {"t": 1010.0, "user": "grpc_typist", "name": "open", "ms": 1.0, "length": 0, "error": "ApiError"}]
    s = summarize(samples)
    ws = s["ws_typist"]
    assert (ws["num_answers"], ws["num_rejected"], ws["num_failures"], ws["num_timeouts"]) == (100, 1, 1, 1)
    assert ws["ttft_p50_ms"] == 50.5 and ws["computed_at_submit_mean"] == 3
    assert ws["itl_p50_ms"] == 10.0 and ws["itl_p99_ms"] == 50.0 and ws["num_itl_gaps"] == 900
    assert ws["answer_p50_ms"] == 5050.0 and ws["output_tokens"] == 1000
    # the window: from the first request's start (t - ms: 1090 - 90 s, the timed-out one) to the last sample (1100)
    assert ws["window_s"] == 100.0 and ws["answers_per_s"] == 1.0 and ws["output_tokens_per_s"] == 10.0
    assert ws["keystroke_rtt_p50_ms"] == 4.0 and ws["num_keystrokes"] == 1
    assert s["grpc_typist"]["failures_by_kind"] == {"open:ApiError": 1}
    assert [r[0] for r in table_rows(s)] == ["grpc_typist", "ws_typist"]  # a class that only failed shows too
    assert [r[0] for r in typing_rows(s)] == ["ws_typist"]


def test_csv_holds_every_class_and_figure(tmp_path):
    s = summarize(_answers("openai_stream", 3) + _answers("open_loop 32:16", 2, tokens=16))
    write_csv(tmp_path / "loadtest.csv", s)
    rows = list(csv.DictReader((tmp_path / "loadtest.csv").open()))
    assert [r["user_class"] for r in rows] == ["open_loop 32:16", "openai_stream"]
    assert set(CSV_FIELDS) <= set(rows[0]) and rows[0]["itl_p50_ms"] == "10.0" and rows[0]["output_tokens"] == "32"


def test_answer_clock_measures_ttft_itl_and_the_whole_answer():
    clock = AnswerClock(started=10.0)
    for t in (10.2, 10.25, 10.35):
        clock.token(t)
    clock.end(10.4)
    assert round(clock.ttft_ms, 6) == 200.0
    assert [round(x, 6) for x in clock.itl_ms] == [50.0, 100.0]
    assert round(clock.total_ms, 6) == 400.0
    assert AnswerClock(started=1.0).ttft_ms is None and AnswerClock(started=1.0).itl_ms == []


def test_arrivals_at_a_fixed_rate_and_a_poisson_process():
    fixed = arrival_times(4.0, "fixed")
    assert [next(fixed) for _ in range(4)] == [0.0, 0.25, 0.5, 0.75]
    poisson = arrival_times(4.0, "poisson", seed=1)
    times = [next(poisson) for _ in range(4000)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert 0.24 < sum(gaps) / len(gaps) < 0.26 and min(gaps) < 0.01 < 0.75 < max(gaps)  # exponential gaps
    assert times[:5] == [next(arrival_times(4.0, "poisson", seed=1)) for _ in range(1)] + times[1:5]
    for rate, kind in ((0, "fixed"), (1, "burst")):
        with pytest.raises(ValueError):
            next(arrival_times(rate, kind))


def test_length_sets_and_questions_of_an_exact_length():
    assert parse_length_sets(["32:16", "128:64"]) == [(32, 16), (128, 64)]
    for bad in (["32"], ["0:4"], ["a:b"], []):
        with pytest.raises(ValueError):
            parse_length_sets(bad)
    from tokenizers import Tokenizer

    from headstart.paths import default_tokenizer_dir

    tok = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    encode = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    maker = QuestionMaker(["How many singers are there?", "List the names of all countries."], encode, tok.decode)
    for n in (5, 32, 100):
        assert abs(len(encode(maker.question(n))) - n) <= 1  # cut at n tokens (a re-tokenized edge may merge)


def test_mixed_scenario_has_the_data_users():
    text = (SCENARIO_DIR / "mixed.py").read_text()
    assert all(f"data_users.{c}" in text for c in ("DataProducer", "GrpcDataProducer", "FlashSubscriber"))
    assert "completers.OpenAIStreamer" in text


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
                {"user": "ws_typist", "name": "answer", "ms": 50.0, "length": 3, "error": None}]
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
    """8 typists (WebSocket and gRPC, 3 tenants, 4 databases) for 20 s on random:tiny."""
    out = _run_loadtest(tmp_path, "steady", "--users", "8", "--time", "20s", "--max-new-tokens", "8")
    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader((out / "locust_stats.csv").open())}
    assert rows[("", "Aggregated")]["Failure Count"] == "0"
    for user in ("ws_typist", "grpc_typist"):
        assert int(rows[(user, "answer")]["Request Count"]) > 0, rows.keys()
    # Locust sees requests only: its Aggregated row adds opens and answers, never keystrokes or TTFTs
    assert {name for _, name in rows} <= {"open", "answer", "rejected", "Aggregated"}, rows.keys()
    answers_and_opens = sum(int(r["Request Count"]) for (t, _), r in rows.items() if t)
    assert int(rows[("", "Aggregated")]["Request Count"]) == answers_and_opens
    assert list(csv.DictReader((out / "locust_failures.csv").open())) == []
    report = json.loads((out / "loadtest.json").read_text())
    for user in ("ws_typist", "grpc_typist"):
        s = report["users"][user]
        assert s["num_failures"] == 0 and s["num_answers"] > 0 and s["ttft_p50_ms"] > 0
        assert s["itl_p50_ms"] > 0 and s["output_tokens_per_s"] > 0 and s["answers_per_s"] > 0
        assert s["keystroke_rtt_p50_ms"] > 0 and s["answer_p99_ms"] >= s["answer_p50_ms"] > 0
    summary = {r["user_class"]: r for r in csv.DictReader((out / "loadtest.csv").open())}
    assert float(summary["ws_typist"]["itl_p99_ms"]) > 0
    assert report["memory"] and report["memory"][0]["replicas_mib"], "the replica's memory was sampled"
    probes = [m["replica_probe"] for m in report["memory"] if "replica_probe" in m]
    assert probes and probes[0]["heap_in_use_mib"] > 0 and probes[0]["gc_objects"] > 0, probes[:2]
    assert "ITL p50 ms" in (out / "loadtest.md").read_text() and "keystroke RTT p50 ms" in (out / "loadtest.md").read_text()
    assert (out / "loadtest.png").stat().st_size > 0 and (out / "locust.html").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_mixed_run_pushes_rows_and_times_their_versions(tmp_path):
    """`mixed` for 25 s on random:tiny (7 users: the 5 of fixed count, 2 typists): the OpenAI
    streamer's answers timed at the client, the data producers' pushes (REST, gRPC) and the flash
    subscriber's ack→data_updated and ack→flash_ready (the local stack's flash worker)
    are recorded, with no failure anywhere, a noisy tenant at its limits included."""
    out = _run_loadtest(tmp_path, "mixed", "--users", "7", "--time", "25s", "--max-new-tokens", "8",
                        "--db", "world_1", "--db", "pets_1", "--flash-push-interval", "3")
    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader((out / "locust_stats.csv").open())}
    assert rows[("", "Aggregated")]["Failure Count"] == "0", list(csv.DictReader((out / "locust_failures.csv").open()))
    for producer in ("data_producer", "grpc_data_producer"):
        assert int(rows[(producer, "push")]["Request Count"]) > 0, rows.keys()
    assert int(rows[("openai_stream", "answer")]["Request Count"]) > 0, rows.keys()
    # the noisy tenant's malformed requests were all refused with a 4xx (a failure otherwise, counted above)
    assert int(rows[("noisy", "bad_input_refused")]["Request Count"]) > 0, rows.keys()
    report = json.loads((out / "loadtest.json").read_text())
    producer, subscriber = report["users"]["data_producer"], report["users"]["flash_subscriber"]
    assert producer["num_rows_pushed"] == 5 * producer["num_pushes"] > 0
    assert subscriber["data_updated_p50_ms"] > 0
    assert subscriber["num_flash_answers"] > 0 and subscriber["flash_ready_p50_ms"] > 0
    streamer = report["users"]["openai_stream"]  # the OpenAI streaming class, timed at the client
    assert streamer["num_answers"] > 0 and streamer["ttft_p50_ms"] > 0 and streamer["itl_p50_ms"] > 0
    assert streamer["output_tokens"] == 8 * streamer["num_answers"]
    assert "ack→flash_ready p50 ms" in (out / "loadtest.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_open_loop_run_at_a_fixed_rate(tmp_path):
    """`open` for 16 s at 3 requests/s (fixed gaps), two length sets taken in turn: each set is a
    class of its own with answers of exactly its length (ignore_eos), timed at the client."""
    out = _run_loadtest(tmp_path, "open", "--time", "16s", "--rate", "3", "--arrival", "fixed",
                        "--lengths", "16:8", "--lengths", "48:4", "--db", "world_1")
    report = json.loads((out / "loadtest.json").read_text())
    assert report["meta"]["rate"] == 3.0 and report["meta"]["arrival"] == "fixed"
    for label, length in (("open_loop 16:8", 8), ("open_loop 48:4", 4)):
        s = report["users"][label]
        assert s["num_failures"] == 0 and s["num_answers"] >= 10, s
        assert s["output_tokens"] == length * s["num_answers"]  # ignore_eos: exactly the length asked
        assert s["ttft_p50_ms"] > 0 and s["itl_p50_ms"] > 0 and s["answers_per_s"] > 0
    assert "open_loop 16:8" in (out / "loadtest.md").read_text()


def _run_loadtest(tmp_path: Path, scenario: str, *args: str) -> Path:
    """`headstart loadtest SCENARIO --model random:tiny ARGS` on the local stack; its output folder
    (the test fails with the run's log and the engine's warnings when the command does)."""
    # NOTE: find_spec, not importorskip: importing locust monkey-patches this process with gevent.
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed (pip install -e .[loadtest])")
    out = tmp_path / scenario
    # NOTE: a run directory of its own: Ray's temp files (and so its cluster)
    # must not be shared with a stack that this checkout is running already.
    env = {**os.environ, "HEADSTART_HOME": str(tmp_path / "home")}
    log = tmp_path / "loadtest.log"
    # NOTE: output to a file, not a pipe: a Ray helper process that outlives the
    # command would hold a pipe open and keep `run` waiting for its end.
    with log.open("w") as sink:
        proc = subprocess.run([sys.executable, "-m", "cli", "loadtest", scenario, "--model", "random:tiny",
                               "--out", str(out), *args],
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
    """`mixed --faults redis-restart` for 30 s on random:tiny: the stack's Redis is killed halfway and
    kept down 4 s; no acknowledged row is lost and every failed request has an API code (issue 29)."""
    out = _run_loadtest(tmp_path, "mixed", "--users", "5", "--time", "30s", "--max-new-tokens", "8",
                        "--db", "world_1", "--db", "pets_1", "--flash-push-interval", "3",
                        "--faults", "redis-restart", "--fault-down-s", "4")
    faults = json.loads((out / "loadtest.json").read_text())["meta"]["faults"]
    (restart,) = faults["injected"]
    assert restart["restarted"] and restart["back_at_s"] - restart["killed_at_s"] >= 4
    assert faults["acked"]["acked_rows"] > 0 and faults["acked"]["lost_rows"] == 0
    assert faults["acked"]["sessions"] == 3 and not faults["acked"]["sessions_behind"]
    assert faults["errors"]["untyped"] == 0 and faults["errors"]["errors"] > 0  # the outage was seen, typed
    assert set(faults["errors"]["by_code"]) == {"UNAVAILABLE"}
    assert "acknowledged rows lost: 0 of" in (out / "loadtest.md").read_text()
