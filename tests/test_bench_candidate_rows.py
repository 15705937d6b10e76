"""`headstart bench candidate-rows` on the tiny random model: its logic and files (timings are not checked)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bench.candidate_rows import kernel_levels, prompt_ids, run_candidate_rows_bench, step_samples, summarize
from cli.app import app
from headstart.engine.runner.model_runner import ModelRunner
from headstart.models import load_model


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("random:tiny", "float64")
    return loaded, ModelRunner(loaded.model, fast_path="off")


def test_each_timed_step_is_one_packed_forward_of_k_rows_sharing_the_prompt(tiny, monkeypatch):
    loaded, runner = tiny
    ids = prompt_ids(loaded.tokenizer)
    forwards: list[tuple[int, int, bool]] = []  # (rows, tokens per row, every row reads the prompt's blocks, shared)
    original = runner.extend_rows

    def counting(rows):
        forwards.append((len(rows), max(len(r.new_ids) for r in rows),
                         all(r.state.ids[:len(ids)] == ids and r.state.shared_nbytes() > 0 for r in rows)))
        return original(rows)

    monkeypatch.setattr(runner, "extend_rows", counting)
    installed: list[str] = []
    levels = {"a": lambda: installed.append("a"), "b": lambda: installed.append("b")}
    samples = step_samples(runner, ids, levels, ks=(1, 3), rounds=2, steps=2)
    # levels and K alternate: round 0 a then b, K 1 then 3; round 1 b then a, K 3 then 1
    assert installed == ["a", "b", "b", "a"]
    assert forwards[0][:2] == (1, len(ids))  # the one prefill of the prompt
    forwards = forwards[1:]
    per_case = 2 + 1  # the untimed first step (copy on write) and the timed ones
    assert [n for n, _, _ in forwards] == [1] * per_case + [3] * per_case + [1] * per_case + [3] * per_case \
        + [3] * per_case + [1] * per_case + [3] * per_case + [1] * per_case
    assert all(tokens == 1 and shares for _, tokens, shares in forwards)  # decode steps over the shared prompt
    assert {name: {k: len(v) for k, v in per_k.items()} for name, per_k in samples.items()} == \
        {"a": {1: 4, 3: 4}, "b": {1: 4, 3: 4}}


@pytest.mark.parametrize("samples, steps, expected", [
    # one round: medians, the step per row, its ratio to K=1
    ({"x": {1: [10.0, 12.0, 11.0], 4: [20.0, 22.0, 40.0]}}, 3,
     [("x", 1, 11.0, 10.0, 11.0, 1.0), ("x", 4, 22.0, 20.0, 5.5, 2.0)]),
    # two rounds, the second twice as loaded: the ratio is the rounds' (3x each), not the pooled medians'
    ({"x": {1: [10.0, 10.0, 20.0, 20.0], 2: [30.0, 30.0, 60.0, 60.0]}}, 2,
     [("x", 1, 15.0, 10.0, 15.0, 1.0), ("x", 2, 45.0, 30.0, 22.5, 3.0)]),
    # levels are summarized apart, each against its own smallest K
    ({"p": {2: [8.0], 8: [16.0]}, "q": {2: [5.0], 8: [5.0]}}, 1,
     [("p", 2, 8.0, 8.0, 4.0, 1.0), ("p", 8, 16.0, 16.0, 2.0, 2.0),
      ("q", 2, 5.0, 5.0, 2.5, 1.0), ("q", 8, 5.0, 5.0, 0.625, 1.0)]),
])
def test_summary_is_the_median_step_per_row_and_ratio_to_the_smallest_k(samples, steps, expected):
    got = [(r["level"], r["k"], r["step_ms"], r["min_ms"], r["row_ms"], r["vs_k1"]) for r in summarize(samples, steps)]
    assert got == expected


def test_a_model_not_served_quantized_is_timed_on_its_own_kernels(tiny):
    _, runner = tiny
    assert list(kernel_levels(runner)) == ["off"]


def test_the_bench_writes_its_table_json_and_plot(tmp_path):
    out = tmp_path / "rows"
    report = run_candidate_rows_bench("random:tiny", out, threads=1, rounds=1, steps=1, ks=(4, 1), dtype="float64")
    saved = json.loads((out / "candidate_rows.json").read_text())
    assert saved["config"]["ks"] == [1, 4] and saved["config"]["levels"] == ["off"]
    assert saved["config"]["prompt_tokens"] == 270  # a Spider prompt's size
    assert [(r["level"], r["k"], r["samples"]) for r in saved["rows"]] == [("off", 1, 1), ("off", 4, 1)]
    assert saved["rows"][0]["vs_k1"] == 1.0 and report["rows"] == saved["rows"]
    table = (out / "candidate_rows.md").read_text()
    assert table.count("\n|") == 2 + 2  # header, rule, a row per K
    assert (out / "candidate_rows.png").stat().st_size > 1000


@pytest.mark.parametrize("args", [["--k", "0"], ["--rounds", "0"], ["--steps", "0"]])
def test_the_cli_refuses_counts_below_one(tmp_path, args):
    result = CliRunner().invoke(app, ["bench", "candidate-rows", "--model", "random:tiny",
                                      "--out", str(tmp_path), *args])
    assert result.exit_code != 0 and "must be >= 1" in result.output
    assert not (tmp_path / "candidate_rows.json").exists()
