"""The `headstart bench neighbour` command (registered in cli/bench.py)."""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
from pathlib import Path

import typer


def bench_neighbour(
    model: str = typer.Option(DEFAULT_MODEL, help="the engine's model (random:<preset> or a HF dir)"),
    dtype: str = typer.Option("float32"),
    rounds: int = typer.Option(2, help="rounds of (B alone, B beside A), alternating in order"),
    per_phase: int = typer.Option(6, help="questions B types and submits per phase"),
    max_new_tokens: int = typer.Option(16),
    text_chars: int = typer.Option(3000, help="length of each of A's texts"),
    max_sessions: int = typer.Option(8, help="sessions of the one replica (A's share is half)"),
    wpm: float = typer.Option(90.0, help="B's typing speed"),
    noise: str = typer.Option("typers,opens,runs", help="what A does, comma-separated (measure each apart)"),
    out: Path = typer.Option(Path("bench-out/neighbour")),
):
    """Tenant A at its limits (sessions, long texts, stuck database opens, heavy Runs) while tenant B types:
    B's TTFT and answer time beside A vs alone, in one run."""
    from bench.neighbour import NOISE_KINDS, run_neighbour_bench

    kinds = tuple(k.strip() for k in noise.split(",") if k.strip())
    if not kinds or any(k not in NOISE_KINDS for k in kinds):
        raise typer.BadParameter(f"--noise takes a comma-separated subset of {', '.join(NOISE_KINDS)}")

    run_neighbour_bench(out, model=model, dtype=dtype, rounds=rounds, per_phase=per_phase,
                        max_new_tokens=max_new_tokens, text_chars=text_chars, max_sessions=max_sessions, wpm=wpm,
                        say=typer.echo, noise=kinds)
