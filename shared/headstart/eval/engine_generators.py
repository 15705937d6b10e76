"""The model-backed modes: every call the evaluation makes into the engine, in one place.

The engine API used (headstart.engine.runtime.EngineRuntime):
- `build_runtime(model=M, [dtype=...], [device=...], [threads=...],
  [table_cache=pfk|independent])` (`headstart.build`): the table modes are an
  engine built with its table cache on (`TABLE_CACHE_OF_MODE`)
- `runtime.complete(db, question, mode=MODE, max_new_tokens=N)` for MODE in
  cold | prefix (the table modes complete in `prefix`: from the prompt's
  table blocks, assembled)
- `replay_typed(runtime, db, question, policy="headstart", wpm=W, seed=S,
  max_new_tokens=N, [speed=X])` (`headstart.replay`) for the session mode (the question typed by
  a seeded synthetic typist into a fresh session, then submitted)
- `runtime.shutdown()` at the end.
Each call returns a result with `.text`, `.ttft_ms` and `.token_ids` (and,
when present, `.prompt_tokens`, `.cached_tokens_at_submit`,
`.computed_tokens_at_submit`, copied into the report row).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from headstart.eval.errors import EngineUnavailableError
from headstart.eval.generator_settings import GeneratorSettings
from headstart.eval.records import EvalQuestion, Generation

COMPLETE_MODES = ("cold", "prefix", "tables-pfk", "tables-independent")
# The eval modes served from table blocks: the engine's `table_cache` setting of each.
TABLE_CACHE_OF_MODE = {"tables-pfk": "pfk", "tables-independent": "independent"}
_RESULT_DETAILS = ("prompt_tokens", "cached_tokens_at_submit", "computed_tokens_at_submit", "total_ms", "finish_reason")


def load_runtime(settings: GeneratorSettings, mode: str = "prefix") -> Any:
    """Build the engine once per run for `mode` (a table mode turns its table
    cache on); EngineUnavailableError when it cannot be imported."""
    try:
        from headstart.build import build_runtime
    except ImportError as exc:
        raise EngineUnavailableError(
            f"model modes need headstart.build.build_runtime, which failed to import: {exc}"
        ) from exc
    options = {"dtype": settings.dtype, "device": settings.device, "threads": settings.threads,
               "table_cache": TABLE_CACHE_OF_MODE.get(mode)}
    return build_runtime(model=settings.model, **{k: v for k, v in options.items() if v is not None})


def engine_mode(mode: str) -> str:
    """The runtime's completion mode for an eval mode: a table mode completes
    in `prefix` on a runtime whose table cache is on (see `load_runtime`)."""
    return "prefix" if mode in TABLE_CACHE_OF_MODE else mode


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
        table_cache = getattr(getattr(runtime, "settings", None), "table_cache", None)
        if mode in TABLE_CACHE_OF_MODE and table_cache not in (None, TABLE_CACHE_OF_MODE[mode]):
            # NOTE: otherwise a table mode would silently measure plain prefix caching.
            raise ValueError(f"mode {mode!r} needs a runtime with table_cache={TABLE_CACHE_OF_MODE[mode]!r}, "
                             f"not {table_cache!r} (build it with load_runtime(settings, {mode!r}))")
        self.runtime = runtime
        self.mode = mode
        self.settings = settings

    def warmup(self, question: EvalQuestion) -> None:
        """One untimed call; a mode the engine rejects fails here, before the run, not per question."""
        try:
            self._call(question)
        except Exception as exc:  # noqa: BLE001 - the engine's own error types are not ours to list
            raise EngineUnavailableError(
                f"the engine failed mode {self.mode!r} on its warm-up question: {type(exc).__name__}: {exc}",
                code="engine_rejected",
            ) from exc

    def generate(self, question: EvalQuestion) -> Generation:
        result, sampled = self._call(question)
        extra: dict[str, Any] = {"num_tokens": len(result.token_ids),
                                 # the answer's tokens, comparable across modes and runs (session = cold)
                                 "tokens_sha256": hashlib.sha256(repr(list(result.token_ids)).encode()).hexdigest()}
        extra.update({k: getattr(result, k) for k in _RESULT_DETAILS if hasattr(result, k)})
        extra.update(getattr(result, "extra", None) or {})  # decode forwards, answer tokens ready at submit
        if self.mode == "session":
            extra["typist_seed"] = question_seed(self.settings.seed, question.question_id)
        if sampled is not None:  # the harness runs and scores each (`harness.score_candidates`)
            extra["candidate_answers"] = sampled
        return Generation(text=result.text, ttft_ms=result.ttft_ms, extra=extra)

    def close(self) -> None:
        self.runtime.shutdown()

    def _db(self, question: EvalQuestion) -> str:
        if self.settings.db_by_path and question.db_path is not None:
            return str(question.db_path)
        return question.db_id

    def _call(self, question: EvalQuestion) -> tuple[Any, list[dict] | None]:
        """The greedy answer's result, and the sampled candidates' answers (None without candidates)."""
        if self.settings.candidates > 1:
            return self._call_candidates(question)
        return self._call_greedy(question), None

    def _call_candidates(self, question: EvalQuestion) -> tuple[Any, list[dict]]:
        from headstart.engine.requests.candidates import CandidateParams
        from headstart.engine.requests.sampling import SamplingParams

        s = self.settings
        wanted = CandidateParams(s.candidates, s.candidate_temperature, s.candidate_top_p, s.seed, wait_all=True,
                                 length_slack=s.candidate_length_slack)
        if self.mode == "session":  # decoded during the typist's pauses, handed over at submit
            result = self._call_greedy(question, wanted)
            return result, result.extra.pop("candidate_answers")
        request = self.runtime.start_complete(self._db(question), question_text(question), engine_mode(self.mode),
                                              SamplingParams(max_new_tokens=s.max_new_tokens), candidates=wanted)
        result = request.result()
        request.candidates.wait()
        # every candidate decoded: when a checked answer could be chosen (the SQL runs come on top)
        result.extra["candidates_done_ms"] = (time.perf_counter() - request.started) * 1000.0
        sampled = [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason, "num_tokens": len(c.token_ids)}
                   for c in request.candidates.candidates() if c.index > 0]
        return result, sampled

    def _call_greedy(self, question: EvalQuestion, candidates: Any = None) -> Any:
        if self.mode == "session":
            from headstart.replay import replay_typed  # the engine (torch) only when a model mode runs

            timing = {} if self.settings.speed is None else {"speed": self.settings.speed}
            return replay_typed(
                self.runtime,
                self._db(question),
                question_text(question),
                policy="headstart",
                wpm=self.settings.wpm,
                seed=question_seed(self.settings.seed, question.question_id),
                max_new_tokens=self.settings.max_new_tokens,
                **({"candidates": candidates} if candidates is not None else {}),  # K=1: today's call
                **timing,
            )
        return self.runtime.complete(
            self._db(question), question_text(question), mode=engine_mode(self.mode),
            max_new_tokens=self.settings.max_new_tokens,
        )
