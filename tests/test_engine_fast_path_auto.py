"""`HEADSTART_FAST_PATH=auto`: the kernels are chosen by timing them on the
machine at start (`fast_path_auto.choose_kernels`, `kernel_choice.measure_auto`).

Timings are never asserted: a fake timer runs each workload for real and
returns the time a table says, so the decision is known in advance. What is
checked: the weighted decision, that a forced choice and a float64 or tiny
model are never timed, that the decision is measured once per model and then
applied to every forward (lone, batched, cold prefill), and that sessions
still generate a cold prefill's tokens with the chosen kernels."""

from __future__ import annotations

import pytest
import torch

from headstart.config import EngineSettings
from headstart.engine.runner import kernel_choice
from headstart.engine.runner.ops.eager import EagerOps
from headstart.engine.runner.auto_timing import WEIGHTS, choose_kernels
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row
from headstart.engine.runner.ops.native import native_supports
from headstart.engine.runtime import EngineRuntime
from headstart.models.loader import load_model
from tests.engine_fixture import typed_then_submitted
from tests.kernel_skips import skip_unless_runs_here

PROMPT = list(range(1000, 1041))
WORKLOADS = ("prefill_64", "decode_1", "decode_4")


class FakeTimer:
    """Runs every timed call (so the workloads really run) and returns
    `ms[kernels][workload]` (seconds), recording each call."""

    def __init__(self, ms: dict[str, dict[str, float]]):
        self.ms, self.calls = ms, []

    def __call__(self, kernels: str, workload: str, fn) -> float:
        fn()
        self.calls.append((kernels, workload))
        return self.ms[kernels][workload] / 1000.0


def never(kernels, workload, fn):
    raise AssertionError(f"timed {kernels} {workload}: this choice must not be measured")


ONEDNN_WINS = {"off": {"prefill_64": 300, "decode_1": 110, "decode_4": 115},
               "onednn": {"prefill_64": 280, "decode_1": 56, "decode_4": 79},
               "native": {"prefill_64": 280, "decode_1": 60, "decode_4": 85}}
OFF_WINS = {"off": {"prefill_64": 300, "decode_1": 80, "decode_4": 82},
            "onednn": {"prefill_64": 310, "decode_1": 97, "decode_4": 99},
            "native": {"prefill_64": 310, "decode_1": 90, "decode_4": 99}}
NATIVE_WINS = {"off": {"prefill_64": 300, "decode_1": 110, "decode_4": 115},
               "onednn": {"prefill_64": 160, "decode_1": 56, "decode_4": 79},
               "native": {"prefill_64": 160, "decode_1": 36, "decode_4": 50}}


def _noop():
    return lambda: None


@pytest.mark.parametrize(("ms", "expected"), [
    (ONEDNN_WINS, "onednn"),
    (OFF_WINS, "off"),
    # onednn decodes 1 ms faster per step but prefills 100 ms slower: off wins the answer
    ({"off": {"prefill_64": 300, "decode_1": 80, "decode_4": 80},
      "onednn": {"prefill_64": 400, "decode_1": 79, "decode_4": 79}}, "off"),
    # a tie goes to the first candidate (off: nothing packed, nothing to keep)
    ({"off": dict.fromkeys(WORKLOADS, 50), "onednn": dict.fromkeys(WORKLOADS, 50)}, "off"),
])
def test_choose_kernels_picks_the_lowest_weighted_total(ms, expected):
    ms = {k: ms[k] for k in ("off", "onednn")}  # two candidates: the interleaving below is theirs
    installed = []
    timer = FakeTimer(ms)
    choice = choose_kernels({name: (lambda n=name: installed.append(n)) for name in ms},
                            [(w, _noop) for w in WORKLOADS], timer, max_rounds=3, min_rounds=3)
    assert choice.kernels == expected and choice.measured and choice.rounds == 3
    assert choice.timings_ms == ms
    assert choice.scores_ms == {k: sum(WEIGHTS[w] * v for w, v in t.items()) for k, t in ms.items()}
    # interleaved: every round runs every candidate, the first alternating
    assert installed == ["off", "onednn", "onednn", "off", "off", "onednn"]
    assert len(timer.calls) == 3 * 2 * len(WORKLOADS)


def test_choose_kernels_keeps_each_workloads_min_over_rounds():
    """A round disturbed by load counts only where it is the least disturbed."""
    seen = iter([500, 80, 90, 60, 100, 70])  # (prefill, decode) per round, three rounds

    def timer(kernels, workload, fn):
        return next(seen) / 1000.0

    choice = choose_kernels({"off": lambda: None}, [("prefill_64", _noop), ("decode_1", _noop)], timer,
                            max_rounds=3, min_rounds=3)
    assert choice.timings_ms == {"off": {"prefill_64": 90, "decode_1": 60}}


def test_choose_kernels_stops_at_its_budget_after_min_rounds():
    choice = choose_kernels({"off": lambda: None}, [("decode_1", _noop)], FakeTimer({"off": {"decode_1": 1}}),
                            max_rounds=5, min_rounds=2, budget_s=0.0)
    assert choice.rounds == 2


def test_choose_kernels_falls_back_when_not_one_round_fits_its_deadline():
    """A machine too loaded to finish one round in time: the caller's static rule, marked unmeasured."""
    timer = FakeTimer(ONEDNN_WINS)
    choice = choose_kernels({"off": lambda: None, "onednn": lambda: None}, [(w, _noop) for w in WORKLOADS],
                            timer, deadline_s=0.0, fallback="onednn")
    assert (choice.kernels, choice.measured, choice.rounds) == ("onednn", False, 0)
    assert "loaded" in choice.reason and timer.calls == []


@pytest.fixture
def tiny32(monkeypatch):
    """random:tiny with `auto` timing it (its hidden size 32 is below the real threshold)."""
    monkeypatch.setattr(kernel_choice, "AUTO_MIN_HIDDEN", 16)
    return ModelRunner(load_model("random:tiny", "float32").model)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_auto_does_not_time_a_tiny_or_float64_model(dtype, monkeypatch):
    runner = ModelRunner(load_model("random:tiny", dtype).model)
    if dtype == "float64":  # big enough, but oneDNN has no float64 kernels
        monkeypatch.setattr(kernel_choice, "AUTO_MIN_HIDDEN", 16)
    assert runner.set_fast_path("auto", timer=never) == "off"
    choice = runner.choice
    assert (choice.kernels, choice.requested, choice.measured) == ("off", "auto", False)
    assert isinstance(runner.ops, EagerOps)


@pytest.mark.parametrize("mode", ["off", "onednn", "native"])
def test_a_forced_choice_is_not_measured(tiny32, mode):
    """HEADSTART_FAST_PATH other than auto: taken as given, the timer never runs."""
    skip_unless_runs_here(tiny32.model, mode)
    assert tiny32.set_fast_path(mode, timer=never) == mode
    choice = tiny32.choice
    assert (choice.kernels, choice.requested, choice.measured) == (mode, mode, False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_machine_too_loaded_to_time_gets_native_where_it_builds(dtype, monkeypatch):
    """auto's fallback (no round fits its deadline) is the fastest on the quiet
    machines measured: native where it builds (twice the decode speed of MKL
    there), else float32 off, bfloat16 onednn."""
    monkeypatch.setattr(kernel_choice, "AUTO_MIN_HIDDEN", 16)
    runner = ModelRunner(load_model("random:tiny", dtype).model)
    given = {}

    def loaded(installs, workloads, timer, fallback):
        given["fallback"] = fallback
        return choose_kernels(installs, workloads, timer, deadline_s=0.0, fallback=fallback)

    monkeypatch.setattr(kernel_choice, "choose_kernels", loaded)
    candidates = kernel_choice.auto_candidates(runner.model)
    if not candidates:  # bfloat16 on an AVX2-only CPU: no oneDNN bf16, no native; nothing to time
        assert runner.set_fast_path("auto", timer=never) == "off" and not given
        assert "not timed" in runner.choice.reason
        return
    expected = "native" if "native" in candidates else ("onednn" if dtype == "bfloat16" else "off")
    assert runner.set_fast_path("auto", timer=never) == expected
    choice = runner.choice
    assert given["fallback"] == expected and (choice.kernels, choice.measured) == (expected, False)


@pytest.mark.parametrize(("ms", "expected"), [(ONEDNN_WINS, "onednn"), (OFF_WINS, "off"), (NATIVE_WINS, "native")])
def test_auto_installs_what_it_measured_once(tiny32, ms, expected):
    if expected not in kernel_choice.auto_candidates(tiny32.model):
        pytest.skip(f"{expected} cannot run here: {native_supports(tiny32.model)}")
    timer = FakeTimer(ms)
    assert tiny32.set_fast_path("auto", timer=timer) == expected
    assert tiny32.fast_path == expected
    choice = tiny32.choice
    assert choice.measured and choice.kernels == expected and choice.requested == "auto"
    assert {k for k, _ in timer.calls} == set(kernel_choice.auto_candidates(tiny32.model))
    assert {w for _, w in timer.calls} == set(WORKLOADS)
    assert not tiny32._measured_ops, "the packed weights are either installed or dropped"
    # measured once per runner: a second runtime given this runner reuses it
    assert tiny32.set_fast_path("auto", timer=never) == expected
    assert tiny32.resolve_choice("auto", timer=never) is choice


def test_autos_choice_serves_every_forward(tiny32):
    """With onednn chosen, a cold prefill, a lone extension and a batched
    forward all run its ops (the LM head is counted per call)."""
    assert tiny32.set_fast_path("auto", timer=FakeTimer(ONEDNN_WINS)) == "onednn"
    ops = tiny32.ops
    heads = []
    original = ops.head
    ops.head = lambda rows: heads.append(rows.shape[0]) or original(rows)
    try:
        cold = tiny32.prefill(PROMPT)
        lone = tiny32.prefill(PROMPT[:20])
        assert tiny32.extend(lone, PROMPT[20:])
        states = [tiny32.prefill(PROMPT[:n]) for n in (7, 19)]
        assert all(tiny32.extend_rows([Row(s, PROMPT[n:n + 2]) for s, n in zip(states, (7, 19))]))
    finally:
        del ops.head
    assert heads == [1, 1, 1, 1, 1, 2]
    torch.testing.assert_close(lone.last_logits, cold.last_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ms", [ONEDNN_WINS, OFF_WINS, NATIVE_WINS], ids=["onednn", "off", "native"])
def test_sessions_match_cold_with_autos_choice(tiny32, ms, tmp_path):
    """The runtime's `auto` applies the measured choice to every mode: an
    anticipatory session and a prefix request generate a cold prefill's tokens."""
    loaded = load_model("random:tiny", "float32")
    runner = ModelRunner(loaded.model, fast_path="auto", timer=FakeTimer(ms))
    expected = runner.fast_path
    runtime = EngineRuntime(EngineSettings(model="random:tiny", dtype="float32", fast_path="auto",
                                           p0_cache_dir=tmp_path, chunk_tokens=64, debounce_ms=0.0), loaded=loaded,
                            runner=runner)
    try:
        assert runtime.fast_path == expected and runtime.fast_path_choice.measured
        question = "How many countries are there in Europe?"
        anticipated = typed_then_submitted(runtime, "world_1", question, 4, 6)
        cold = runtime.complete("world_1", question, "cold", 6).token_ids
        assert anticipated == cold
        assert runtime.complete("world_1", question, "prefix", 6).token_ids == cold
        assert runtime.runner is runner and runner.fast_path == expected
    finally:
        runtime.shutdown()


def test_auto_leaves_no_scratch_state(tiny32):
    """Measuring leaves the model as it was before (a later P0 is prefilled
    with the installed kernels only)."""
    tiny32.set_fast_path("onednn")
    before = tiny32.ops
    choice = tiny32.resolve_choice("auto", timer=FakeTimer(OFF_WINS))
    assert choice.kernels == "off" and tiny32.ops is before
