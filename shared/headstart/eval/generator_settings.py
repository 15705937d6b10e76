"""The options of the model-backed eval modes, in a module of their own so the
mode registry (`generators`) and the engine-backed generators
(`engine_generators`) both import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GeneratorSettings:
    """Options of the model-backed modes (ignored by `gold`).

    `dtype`, `device` and `threads` are passed to the engine only when set;
    `wpm`, `seed` and `speed` drive the synthetic typist of the `session` mode
    (`speed` > 1 replays typing faster than real time; None = the engine's
    default, real time). `db_by_path` names databases to the engine by their
    SQLite path instead of their Spider id (datasets outside shared/spider).
    `candidates` > 1 decodes that many answers per question (the greedy one
    and sampled ones at `candidate_temperature`/`candidate_top_p`, candidate
    i seeded `seed + i`, each bounded at the greedy answer's length +
    `candidate_length_slack` tokens) for the execution-checked EX.
    """

    model: str = ""
    dtype: str | None = None
    device: str | None = None
    threads: int | None = None
    max_new_tokens: int = 256
    wpm: float = 40.0
    seed: int = 0
    speed: float | None = None
    db_by_path: bool = False
    candidates: int = 1
    candidate_temperature: float = 0.7
    candidate_top_p: float = 1.0
    candidate_length_slack: int = 16  # the engine's DEFAULT_LENGTH_SLACK (not imported: no torch here)
