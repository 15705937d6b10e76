"""The model-backed modes: the exact engine calls, and a real `random:tiny` run (the CI check)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from headstart.eval.cli import eval_command
from headstart.eval.engine_generators import TABLE_CACHE_OF_MODE, EngineGenerator, load_runtime, question_seed
from headstart.eval.errors import EngineUnavailableError
from headstart.eval.generators import GeneratorSettings
from headstart.eval.records import EvalQuestion
from headstart.paths import default_spider_dir

needs_spider = pytest.mark.skipif(not (default_spider_dir() / "dev.json").is_file(), reason="Spider data not found")


@dataclass
class FakeResult:
    text: str
    ttft_ms: float
    token_ids: list[int]
    prompt_tokens: int = 100


@dataclass
class RecordingRuntime:
    """Records calls (a unit test of the generator's call shapes, not of the engine)."""

    calls: list[tuple] = field(default_factory=list)
    reject: bool = False

    def complete(self, db, question, mode, max_new_tokens):
        if self.reject:
            raise ValueError(f"unknown mode {mode!r}")
        self.calls.append(("complete", db, question, mode, max_new_tokens))
        return FakeResult("SELECT 1", 3.5, [1, 2])

    def replay_typed(self, db, question, policy, wpm, seed, max_new_tokens, **timing):
        self.calls.append(("replay_typed", db, question, policy, wpm, seed, max_new_tokens, timing))
        return FakeResult("SELECT 2", 0.5, [3])

    def shutdown(self):
        self.calls.append(("shutdown",))


QUESTION = EvalQuestion(0, "7", "pets_1", "How many pets?", "SELECT count(*) FROM pets", Path("/d/pets_1.sqlite"))
BIRD_QUESTION = EvalQuestion(1, "8", "shop", "Best rate?", "SELECT 1", Path("/d/shop.sqlite"), evidence="rate = a / b")


@pytest.mark.parametrize(
    ("mode", "settings", "question", "call"),
    [
        ("cold", GeneratorSettings(max_new_tokens=64), QUESTION, ("complete", "pets_1", "How many pets?", "cold", 64)),
        ("prefix", GeneratorSettings(), QUESTION, ("complete", "pets_1", "How many pets?", "prefix", 256)),
        ("tables-pfk", GeneratorSettings(), QUESTION, ("complete", "pets_1", "How many pets?", "prefix", 256)),
        ("tables-independent", GeneratorSettings(db_by_path=True), QUESTION,
         ("complete", "/d/pets_1.sqlite", "How many pets?", "prefix", 256)),
        ("cold", GeneratorSettings(), BIRD_QUESTION,
         ("complete", "shop", "Best rate?\nExternal knowledge: rate = a / b", "cold", 256)),
        ("session", GeneratorSettings(wpm=90.0, seed=3, max_new_tokens=32), QUESTION,
         ("replay_typed", "pets_1", "How many pets?", "headstart", 90.0, question_seed(3, "7"), 32, {})),
        ("session", GeneratorSettings(speed=10.0), QUESTION,
         ("replay_typed", "pets_1", "How many pets?", "headstart", 40.0, question_seed(0, "7"), 256, {"speed": 10.0})),
    ],
)
def test_engine_calls(mode: str, settings: GeneratorSettings, question: EvalQuestion, call: tuple,
                      monkeypatch) -> None:
    runtime = RecordingRuntime()
    monkeypatch.setattr("headstart.replay.replay_typed",
                        lambda rt, *args, **kwargs: rt.replay_typed(*args, **kwargs))
    generator = EngineGenerator(runtime, mode, settings)
    generation = generator.generate(question)
    generator.close()
    assert runtime.calls == [call, ("shutdown",)]
    assert generation.ttft_ms in (3.5, 0.5)
    assert generation.extra["num_tokens"] == (1 if mode == "session" else 2)
    assert generation.extra["prompt_tokens"] == 100


@pytest.mark.parametrize(
    ("mode", "settings", "options"),
    [
        ("cold", GeneratorSettings(model="m"), {"model": "m"}),
        ("session", GeneratorSettings(model="m", threads=1), {"model": "m", "threads": 1}),
        ("tables-pfk", GeneratorSettings(model="m"), {"model": "m", "table_cache": "pfk"}),
        ("tables-independent", GeneratorSettings(model="m", dtype="float64"),
         {"model": "m", "dtype": "float64", "table_cache": "independent"}),
    ],
)
def test_load_runtime_settings_per_mode(monkeypatch, mode: str, settings: GeneratorSettings, options: dict) -> None:
    """A table mode is `prefix` on an engine whose table cache is on: the settings it is built with."""
    built: list[dict] = []
    monkeypatch.setattr("headstart.build.build_runtime", lambda **kw: built.append(kw) or "rt")
    assert load_runtime(settings, mode) == "rt"
    assert built == [options]


@pytest.mark.parametrize(("mode", "table_cache"), [("tables-pfk", "off"), ("tables-pfk", "independent"),
                                                  ("tables-independent", "pfk")])
def test_a_table_mode_needs_its_table_cache(mode: str, table_cache: str) -> None:
    runtime = RecordingRuntime()
    runtime.settings = SimpleNamespace(table_cache=table_cache)
    with pytest.raises(ValueError, match=f"needs a runtime with table_cache={TABLE_CACHE_OF_MODE[mode]!r}"):
        EngineGenerator(runtime, mode, GeneratorSettings())


def test_typist_seed_is_stable_and_per_question() -> None:
    assert question_seed(0, "7") == question_seed(0, "7")
    assert len({question_seed(0, str(i)) for i in range(100)}) == 100


def test_a_mode_the_engine_rejects_fails_at_warmup() -> None:
    generator = EngineGenerator(RecordingRuntime(reject=True), "tables-pfk", GeneratorSettings())
    with pytest.raises(EngineUnavailableError, match="failed mode 'tables-pfk' on its warm-up question") as info:
        generator.warmup(QUESTION)
    assert info.value.code == "engine_rejected"


@needs_spider
@pytest.mark.parametrize(("mode", "limit", "extra"),
                         [("cold", 20, {}), ("session", 3, {"speed": 50.0}), ("tables-pfk", 3, {})])
def test_random_tiny_runs_through_the_harness(tmp_path: Path, monkeypatch, mode: str, limit: int, extra: dict) -> None:
    """The CI check: the real engine with random weights answers; the harness scores and times it."""
    pytest.importorskip("headstart.engine.runtime")
    monkeypatch.setenv("HEADSTART_HOME", str(tmp_path / "home"))
    summary = eval_command(
        mode=mode, model="random:tiny", limit=limit, out=tmp_path / "out", threads=1, max_new_tokens=8, **extra
    )
    assert (summary["n"], summary["skipped"], summary["gold_errors"], summary["num_ttft"]) == (limit, 0, 0, limit)
    assert summary["ttft_p50_ms"] > 0
    assert summary["pred_error_codes"].get("generation_error") is None
    rows = json.loads((tmp_path / "out" / "eval.json").read_text())["questions"]
    assert len(rows) == limit
    assert all(row["ttft_ms"] > 0 and row["extra"]["num_tokens"] > 0 for row in rows)
