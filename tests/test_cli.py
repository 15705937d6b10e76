"""The `headstart` commands, run as a user runs them (subprocess, random:tiny)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from headstart.kernels.native import unavailable_reason
from headstart.typist import Typist

HEADSTART = [sys.executable, "-m", "cli"]


def run(args, tmp_path):
    env = {**os.environ, "HEADSTART_HOME": str(tmp_path / "home")}
    return subprocess.run(HEADSTART + args, capture_output=True, text=True, env=env, timeout=300)


def test_replay_writes_result_json(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(Typist(wpm=3000, typo_rate=0.1, seed=1).trace("How many singers are there?").to_jsonl())
    outputs = {}
    for mode in ("cold", "prefix", "session"):
        out = tmp_path / f"{mode}.json"
        proc = run(["replay", "--model", "random:tiny", "--dtype", "float64", "--db", "concert_singer",
                    "--trace", str(trace), "--mode", mode, "--max-new-tokens", "6", "--json", str(out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "TTFT" in proc.stdout
        outputs[mode] = json.loads(out.read_text())
    for key in ("token_ids", "text", "ttft_ms", "cached_tokens_at_submit", "computed_tokens_at_submit",
                "wasted_tokens"):
        assert key in outputs["session"]
    assert outputs["session"]["token_ids"] == outputs["cold"]["token_ids"] == outputs["prefix"]["token_ids"]
    assert outputs["cold"]["cached_tokens_at_submit"] == 0


def test_replay_bad_inputs_give_clear_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0, "text": "a"}\n')
    cases = [
        (["--trace", str(bad)], "no submit"),
        (["--trace", str(tmp_path / "missing.jsonl")], "cannot read trace"),
        (["--trace", str(bad), "--db", "no_such_db"], "no submit"),
    ]
    good = tmp_path / "good.jsonl"
    good.write_text(Typist(wpm=3000).trace("hi").to_jsonl())
    cases += [
        (["--trace", str(good), "--db", "no_such_db"], "cannot resolve database"),
        (["--trace", str(good), "--model", "random:huge"], "unknown model preset"),
        (["--trace", str(good), "--mode", "warp"], "unknown mode"),
        (["--trace", str(good), "--dtype", "int3"], "unknown dtype"),
    ]
    # in this process (one start-up for all cases, not one each), then one through the real entry point
    from typer.testing import CliRunner

    from cli.app import app

    runner = CliRunner()
    for args, message in cases:
        result = runner.invoke(app, ["replay", "--model", "random:tiny", *args] if "--model" not in args
                               else ["replay", *args], env={"HEADSTART_HOME": str(tmp_path / "home")})
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert message in result.stderr, (args, result.stderr)
        assert isinstance(result.exception, SystemExit), (args, result.exception)  # no uncaught error
    proc = run(["replay", "--model", "random:tiny", "--trace", str(good), "--mode", "warp"], tmp_path)
    assert proc.returncode == 2 and "unknown mode" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_demo_replays_every_mode_checks_then_serves_and_says_open_once_up(tmp_path, monkeypatch):
    """`headstart demo`: cold, prefix and session, each answer's SQL as plain text and its checked
    choice among --candidates, then the local stack with every option a value (a command called as a
    function gets no typer defaults: `openai_database` came as an OptionInfo); "open" only once the
    stack says its page answers (it was printed before Ray even started)."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import cli.replay
    from cli.app import app

    stacks = []  # `serve_command`'s import finds this launcher (the real one would import Ray: seconds)

    def serve_command(**options):
        stacks.append(options)
        options["say"]("headstart is up")
        options["on_ready"](SimpleNamespace(http_url="http://localhost:8123"))

    monkeypatch.setitem(sys.modules, "services.launcher", SimpleNamespace(serve_command=serve_command))
    monkeypatch.setattr(cli.replay, "MAX_ANSWER_TOKENS", 4)  # random:tiny's answers never end at EOS
    result = CliRunner().invoke(app, ["demo", "--model", "random:tiny", "--db", "concert_singer", "--question",
                                      "How many singers?", "--wpm", "3000", "--out", str(tmp_path / "demo"),
                                      "--port", "8123", "--candidates", "3"],
                                env={"HEADSTART_HOME": str(tmp_path / "home")})
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.output.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("== ")] == \
        ["== cold", "== prefix", "== session", "== serving", "== open http"]
    assert lines.index("headstart is up") < lines.index(
        "== open http://localhost:8123/?candidates=3 and type a question about concert_singer (Ctrl-C stops)")
    generated = [line for line in lines if line.startswith("generated: ")]
    assert len(generated) == 3 and not any("```" in g or "\\n" in g or "'" in g for g in generated), generated
    # random:tiny's 4 tokens are no SQL: every candidate fails, each mode says so
    assert sum(line.startswith("checked  : no candidate's SQL ran (3 checked)") for line in lines) == 3
    # the session's TTFT says what the engine was doing at Enter (it was printed above prefix's unexplained)
    whys = [i for i, line in enumerate(lines) if line.startswith("why      : at Enter")]
    session = next(i for i, line in enumerate(lines) if line.startswith("== session"))
    assert len(whys) == 1 and session < whys[0], result.output
    (options,) = stacks
    assert options["port"] == 8123 and options["host"] == "127.0.0.1" and options["openai_database"] == ""
    assert options["quiet"] is True
    assert [name for name, value in options.items() if type(value).__module__.startswith("typer")] == []


def test_demo_prints_the_extracted_sql_and_the_checked_answer_with_its_rows(capsys):
    """The answer as SQL text (the eval's extractor: no code fence, no repr), then the chosen SQL,
    how many candidates agreed and its first rows as a table with the count of all."""
    from headstart.candidates import CheckedChoice, RunOutcome
    from headstart.engine.requests.generation import SubmitResult

    from cli.replay import print_result

    chosen = "SELECT CountryCode, count(*) FROM city\nGROUP BY CountryCode"
    choice = CheckedChoice(3, chosen, ("CountryCode", "count(*)"), (("ABW", 1), ("AFG", 4)), agreed=5,
                           num_candidates=8, failed=(0, 6), outcomes=(
                               RunOutcome(0, "SELECT c.Code FROM city c", None, error="no such column: c.Code"),
                               RunOutcome(3, chosen, "k", ("CountryCode", "count(*)"), (("ABW", 1), ("AFG", 4)),
                                          num_rows=232)))
    result = SubmitResult([1], "```sql\nSELECT c.Code\nFROM city c;\n```", 12.0, 30.0, 342, 336, 6,
                          extra={"choice": choice, "checked_ms": 2345.6})
    print_result(SimpleTrace("How many cities are there in each country?"), result)
    assert capsys.readouterr().out.splitlines() == [
        "question : How many cities are there in each country?",
        "generated: SELECT c.Code",
        "           FROM city c",
        "TTFT 12.0 ms | prompt 342 tokens, cached at submit 336, computed at submit 6, wasted while typing 0",
        "checked  : SELECT CountryCode, count(*) FROM city",
        "           GROUP BY CountryCode",
        "           sampled candidate 3; 5 of 8 candidates return this result, 2 failed; chosen 2346 ms after Enter",
        "           CountryCode | count(*)",
        "           ------------+---------",
        "           ABW         | 1",
        "           AFG         | 4",
        "           (232 rows, first 2 shown)",
    ]


def test_the_enter_report_says_what_the_engine_was_doing_at_enter():
    """The session mode's line under its TTFT, from the forward trace: the forward in flight at Enter
    and how long the answer waited for it; an idle engine; the answer decoded ahead."""
    from cli.enter_report import enter_report

    lines = [{"t": 1.0, "ms": 100.0, "rows": [["type:s1", "STREAM", 7, 7, 335]]},
             {"t": 2.0, "ms": 600.0, "rows": [["type:s1", "STREAM", 6, 6, 336]]},
             {"t": 2.6, "ms": 40.0, "rows": [["submit:s1", "SUBMIT", 1, 0, 342]]}]
    assert enter_report(lines, 2.2, 2.64, 0) == (
        "at Enter a forward of its typing catch-up (6 new tokens: the last keystrokes and the prompt's end after "
        "them, recomputed at each key) had run 200 ms; the answer waited 400 ms for it (a forward in flight is "
        "not aborted), where the prefix mode met an idle engine")
    lines[1]["rows"].append(["ahead:s1", "IDLE", 1, 1, 342])
    assert enter_report(lines, 2.2, 2.64, 0).startswith(
        "at Enter a forward of its answer-ahead decoding and its typing catch-up (7 new tokens) had run 200 ms;")
    assert enter_report(lines, 1.5, 1.6, 0) == (
        "at Enter: the engine was idle and the prompt cached; the TTFT is the answer's own forwards (100 ms)")
    assert enter_report(lines, 2.2, 2.2, 4) == ("at Enter: the answer's first 4 token(s) were decoded during the "
                                                "pause (answer-ahead): the TTFT is the time to hand them over")


class SimpleTrace:
    def __init__(self, final_text):
        self.final_text = final_text


def test_bench_ttft_plumbing(tmp_path):
    """The benchmark's files and fields (timings are not asserted: benchmarks are not tests)."""
    out = tmp_path / "ttft"
    proc = run(["bench", "ttft", "--model", "random:tiny", "--db", "world_1", "car_1", "--questions", "2",
                "--wpm", "3000", "--max-new-tokens", "4", "--out", str(out), "--llamacpp", "off"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "ttft.json").read_text())
    assert set(report["modes"]) == {"cold", "prefix", "paper", "headstart"}
    for stats in report["modes"].values():
        assert {"mean_ms", "p50_ms", "p90_ms", "p99_ms", "computed_tokens_at_submit_mean",
                "wasted_tokens_mean"} <= set(stats)
    assert report["decode_step_ms"] > 0 and len(report["rows"]) == 8
    assert report["config"]["dbs"] == ["world_1", "car_1"]
    assert report["config"]["fast_path_choice"] == {  # why these kernels: auto on a tiny model is not timed
        "kernels": "off", "requested": "auto", "measured": False, "rounds": 0, "seconds": 0.0,
        "timings_ms": {}, "scores_ms": {}, "reason": report["config"]["fast_path_choice"]["reason"]}
    assert "kernels: off (requested auto, not timed)" in (out / "ttft.md").read_text()
    assert (out / "ttft.md").read_text().count("\n|") >= 5 and (out / "ttft.png").stat().st_size > 1000


def test_bench_ready_exit_plumbing(tmp_path):
    """`bench ready-exit` on random:tiny: its files, one ready position per batch, every question answered."""
    out = tmp_path / "ready"
    proc = run(["bench", "ready-exit", "--model", "random:tiny", "--db", "concert_singer", "--batches", "2",
                "--max-rows", "8", "--spider", "1", "--max-new-tokens", "3", "--threads", "1", "--out", str(out)],
               tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "ready-exit.json").read_text())
    assert [(p["db"], p["rows"]) for p in report["points"]] == [("concert_singer", 4), ("concert_singer", 8)]
    assert [len(p["answers"]) for p in report["points"]] == [1 + 3, 1 + 3]
    assert [t["tau"] for t in report["thresholds"]] == [0.5, 1.0, 2.0, 4.0, 8.0]
    for t in report["thresholds"]:
        assert t["queries"] == 8 and t["right"] <= t["fires"] <= 8 and t["fires_in_v"] <= t["fires"]
    assert (out / "ready-exit.md").read_text().count("\n|") >= 8 and (out / "ready-exit.png").stat().st_size > 1000
    proc = run(["bench", "ready-exit", "--model", "random:tiny", "--db", "world_1", "--out", str(out)], tmp_path)
    assert proc.returncode == 2 and "no stream questions for ['world_1']" in proc.stderr


def test_bench_decode_step_plumbing(tmp_path):
    """One decode step per kernel choice: the files, the cases, and every
    kernel picking the model's own forward's tokens (timings not asserted)."""
    out = tmp_path / "decode"
    proc = run(["bench", "decode-step", "--model", "random:tiny", "--dtype", "float32", "--kernels",
                "off,onednn,native,auto", "--rows", "1", "--rows", "3", "--steps", "3", "--prompt-tokens", "20",
                "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "decode_step.json").read_text())
    cases = [(r["case"], r["rows"]) for r in report["results"]]
    assert cases == [(c, n) for c in ("off", "onednn", "native", "auto") for n in (1, 3)]
    # native needs AVX-512 (and HEADSTART_CPU_ISA not restricting it): elsewhere its rows say why they were skipped
    native_missing = unavailable_reason() is not None
    ran = [r for r in report["results"] if not (native_missing and r["case"] == "native")]
    assert all("skipped" in r for r in report["results"] if r not in ran)
    assert all(r["same_tokens"] and r["min_ms"] > 0 for r in ran)
    # a cold prefill per kernel set; auto on random:tiny is `off`, untimed
    assert [r["prefill_ms"] is not None for r in ran] == [True, False] * (len(ran) // 2)
    assert {(r["installed"], r["auto"]["measured"]) for r in report["results"] if r["case"] == "auto"} == {("off", False)}
    assert (out / "decode_step.md").read_text().count("\n|") >= 7 and (out / "decode_step.png").stat().st_size > 1000
    proc = run(["bench", "decode-step", "--model", "random:tiny", "--kernels", "fastest", "--out", str(out)], tmp_path)
    assert proc.returncode == 2 and "valid: off, onednn, native, inductor" in proc.stderr


def test_bench_batch_invariance_plumbing(tmp_path):
    """Batched rows against their lone forwards: bit-identical with HEADSTART_BATCH_INVARIANT on."""
    out = tmp_path / "inv"
    proc = run(["bench", "batch-invariance", "--model", "random:tiny", "--dtype", "float32", "--kernels", "off",
                "--rows", "3", "--repeats", "1", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "batch_invariance.json").read_text())
    assert [r["batch_invariant"] for r in report["results"]] == [False, True]
    assert report["results"][1]["bit_identical"] and report["results"][1]["max_abs_diff"] == 0.0
    assert (out / "batch_invariance.md").read_text().count("\n|") >= 3
