"""Where predicted SQL comes from: the `SqlGenerator` contract and the mode registry.

A generator is built once per run from `GENERATORS[mode]` and asked for one
answer per question, in dataset order, one at a time (so TTFT is measured on
an otherwise idle engine). `gold` answers with the gold SQL: the harness's own
sanity check, which must score 100%. Every other mode is a serving path of the
engine; their calls into the engine live in `engine_generators.py`.
"""

from __future__ import annotations

from typing import Callable, Protocol

from headstart.eval.errors import ConfigError
from headstart.eval.generator_settings import GeneratorSettings  # noqa: F401 (re-exported)
from headstart.eval.records import EvalQuestion, Generation


class SqlGenerator(Protocol):
    """Answers questions through one serving path."""

    mode: str

    def warmup(self, question: EvalQuestion) -> None:
        """Called once before the timed loop, so first-call costs (CUDA init, compile) are not a TTFT."""
        ...

    def generate(self, question: EvalQuestion) -> Generation:
        """The model's raw answer to `question` and its TTFT; called once per scored question."""
        ...

    def close(self) -> None:
        """Release the engine; called once when the run ends."""
        ...


class GoldGenerator:
    """Answers with the gold SQL: gold-on-gold must score 100% (the harness's sanity check)."""

    mode = "gold"

    def warmup(self, question: EvalQuestion) -> None:
        return None

    def generate(self, question: EvalQuestion) -> Generation:
        return Generation(text=question.gold_sql, ttft_ms=None, extra={})

    def close(self) -> None:
        return None


def _engine_factory(mode: str) -> Callable[[GeneratorSettings], SqlGenerator]:
    def build(settings: GeneratorSettings) -> SqlGenerator:
        # Imported here: the gold mode and the tests of the harness need no engine.
        from headstart.eval.engine_generators import EngineGenerator, load_runtime

        return EngineGenerator(load_runtime(settings, mode), mode, settings)

    return build


GENERATORS: dict[str, Callable[[GeneratorSettings], SqlGenerator]] = {
    "gold": lambda settings: GoldGenerator(),
    "cold": _engine_factory("cold"),
    "prefix": _engine_factory("prefix"),
    "session": _engine_factory("session"),
    "tables-pfk": _engine_factory("tables-pfk"),
    "tables-independent": _engine_factory("tables-independent"),
}
MODES = tuple(GENERATORS)


def build_generator(mode: str, settings: GeneratorSettings) -> SqlGenerator:
    """The generator of `mode`; ConfigError listing the valid modes otherwise."""
    if mode not in GENERATORS:
        raise ConfigError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if settings.max_new_tokens <= 0:
        raise ConfigError(f"max_new_tokens must be positive, got {settings.max_new_tokens}")
    return GENERATORS[mode](settings)
