"""`python -m bench.runner_steps` end to end on the tiny random model (timings are not checked)."""

from __future__ import annotations

import json

import pytest

from bench.runner_steps import STEPS, main


def test_runner_steps_writes_its_table_json_and_plot(tmp_path):
    out = tmp_path / "steps"
    main(["--model", "random:tiny", "--dtype", "float64", "--p0", "40", "--cold", "20", "--extend", "5",
          "--decode", "2", "--rows", "2", "--rounds", "1", "--out", str(out)])
    report = json.loads((out / "runner_steps.json").read_text())
    assert list(report["median_ms"]) == list(STEPS) and all(ms > 0 for ms in report["median_ms"].values())
    assert len(report["rounds"]) == 1
    assert (out / "runner_steps.md").read_text().count("\n|") == len(STEPS) + 2  # header, rule, a row per step
    assert (out / "runner_steps.png").stat().st_size > 1000


def test_runner_steps_refuses_empty_counts(tmp_path):
    with pytest.raises(SystemExit):
        main(["--model", "random:tiny", "--rows", "0", "--out", str(tmp_path)])
