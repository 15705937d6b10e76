"""The model-backed modes: every call the evaluation makes into the engine, in one place.

The engine API used (headstart.engine.runtime):
- `EngineRuntime.from_settings(model=..., [dtype=...], [device=...])`
- `runtime.complete(db, question, mode=M, max_new_tokens=N)` for M in
  cold | prefix | tables-pfk | tables-independent
- `runtime.replay_typed(db, question, policy="headstart", wpm=W, seed=S, max_new_tokens=N)`
  for the session mode (the question typed by a seeded synthetic typist)
Each returns an object with `.text`, `.ttft_ms` and `.token_ids`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from headstart.eval.errors import EngineUnavailableError
from headstart.eval.generators import GeneratorSettings
from headstart.eval.records import EvalQuestion, Generation

COMPLETE_MODES = ("cold", "prefix", "tables-pfk", "tables-independent")


def load_runtime(settings: GeneratorSettings) -> Any:
    """Build the engine once per run; EngineUnavailableError when it cannot be imported."""
    try:
        from headstart.engine.runtime import EngineRuntime
    except ImportError as exc:
        raise EngineUnavailableError(
            f"model modes need headstart.engine.runtime.EngineRuntime, which failed to import: {exc}"
        ) from exc
    options = {"dtype": settings.dtype, "device": settings.device}
    return EngineRuntime.from_settings(model=settings.model, **{k: v for k, v in options.items() if v is not None})


def question_seed(seed: int, question_id: str) -> int:
    """A per-question typist seed, the same in every process (sha256, not hash())."""
    digest = hashlib.sha256(f"{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def question_text(question: EvalQuestion) -> str:
    """What the user asks: BIRD's evidence ("external knowledge") follows the question."""
    if question.evidence:
        return f"{question.question}\nExternal knowledge: {question.evidence}"
    return question.question


class EngineGenerator:
    """One serving path of the engine (`mode`), answering one question at a time."""

    def __init__(self, runtime: Any, mode: str, settings: GeneratorSettings) -> None:
        if mode not in COMPLETE_MODES and mode != "session":
            raise ValueError(f"unknown engine mode {mode!r}; valid: {', '.join(COMPLETE_MODES + ('session',))}")
        self.runtime = runtime
        self.mode = mode
        self.settings = settings

    def warmup(self, question: EvalQuestion) -> None:
        self._call(question)

    def generate(self, question: EvalQuestion) -> Generation:
        result = self._call(question)
        extra: dict[str, Any] = {"num_tokens": len(result.token_ids)}
        if self.mode == "session":
            extra["typist_seed"] = question_seed(self.settings.seed, question.question_id)
        return Generation(text=result.text, ttft_ms=result.ttft_ms, extra=extra)

    def close(self) -> None:
        closer = getattr(self.runtime, "close", None)
        if callable(closer):
            closer()

    def _call(self, question: EvalQuestion) -> Any:
        if self.mode == "session":
            return self.runtime.replay_typed(
                question.db_id,
                question_text(question),
                policy="headstart",
                wpm=self.settings.wpm,
                seed=question_seed(self.settings.seed, question.question_id),
                max_new_tokens=self.settings.max_new_tokens,
            )
        return self.runtime.complete(
            question.db_id, question_text(question), mode=self.mode, max_new_tokens=self.settings.max_new_tokens
        )
