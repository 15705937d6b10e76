"""`headstart`: the one entry point for every command a user runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (they print a table, write JSON and a plot).")
app.add_typer(bench_app, name="bench")

MODEL_HELP = "local HF model dir, hub id, or random:<preset> (tiny, qwen2.5-coder-0.5b|1.5b|3b|7b)"


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@app.command()
def replay(
    trace: Path = typer.Option(..., help="typing trace (JSON lines: {t, text} ..., {t, submit: true})"),
    db: str = typer.Option("world_1", help="Spider db id, SQLite path or PostgreSQL DSN"),
    model: str = typer.Option("random:qwen2.5-coder-0.5b", help=MODEL_HELP),
    policy: str = typer.Option("headstart", help="confirmation policy: headstart | paper"),
    mode: str = typer.Option("session", help="cold | prefix | session"),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads"),
    max_new_tokens: int = typer.Option(64),
    speed: float = typer.Option(1.0, help="replay speed: 4 = four times faster than recorded"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the result as JSON here"),
):
    """Replay a typing trace in real time and print the SQL and the time to first token."""
    from headstart.engine.errors import HeadstartError
    from headstart.models import ModelLoadError
    from headstart.schema import SchemaError
    from headstart.trace import TraceError, load_trace

    try:
        parsed = load_trace(trace)
        from headstart.replay_modes import replay_in_mode
        from headstart.engine.runtime import EngineRuntime

        runtime = EngineRuntime.from_settings(model=model, dtype=dtype, device=device, threads=threads)
        try:
            result = replay_in_mode(runtime, db, parsed, mode, policy, max_new_tokens, speed)
        finally:
            runtime.shutdown()
    except (TraceError, SchemaError, ModelLoadError, HeadstartError, ValueError) as exc:
        _fail(str(exc))
    out = {
        "db": db, "mode": mode, "policy": policy if mode == "session" else None, "model": model,
        "token_ids": result.token_ids, "text": result.text, "ttft_ms": result.ttft_ms,
        "total_ms": result.total_ms, "prompt_tokens": result.prompt_tokens,
        "cached_tokens_at_submit": result.cached_tokens_at_submit,
        "computed_tokens_at_submit": result.computed_tokens_at_submit,
        "wasted_tokens": result.wasted_tokens, **result.extra,
    }
    _print_result(parsed, result)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(out, indent=2))


@app.command()
def demo(
    model: str = typer.Option("random:qwen2.5-coder-0.5b", help=MODEL_HELP),
    db: str = typer.Option("world_1"),
    question: str = typer.Option("How many cities are there in each country?"),
    wpm: float = typer.Option(60.0),
    threads: Optional[int] = typer.Option(None),
    out: Path = typer.Option(Path(".headstart/demo"), help="where the generated trace goes"),
):
    """The embedded default: a synthetic typist against a Spider db, in every mode."""
    from headstart.engine.runtime import EngineRuntime
    from headstart.replay_modes import replay_in_mode
    from headstart.typist import Typist

    trace = Typist(wpm=wpm, typo_rate=0.03, pause_s=0.5, seed=0).trace(question)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace.jsonl").write_text(trace.to_jsonl())
    typer.echo(f"model {model}; database {db}; typing trace in {out / 'trace.jsonl'}")
    runtime = EngineRuntime.from_settings(model=model, threads=threads)
    try:
        for mode in ("cold", "prefix", "session"):
            typer.secho(f"\n== {mode}: replaying {trace.submit_t:.1f} s of typing", bold=True)
            _print_result(trace, replay_in_mode(runtime, db, trace, mode, max_new_tokens=24))
    finally:
        runtime.shutdown()


def _print_result(trace, result) -> None:
    typer.echo(f"question : {trace.final_text}")
    typer.echo(f"generated: {result.text!r}")
    typer.echo(
        f"TTFT {result.ttft_ms:.1f} ms | prompt {result.prompt_tokens} tokens, cached at submit "
        f"{result.cached_tokens_at_submit}, computed at submit {result.computed_tokens_at_submit}, "
        f"wasted while typing {result.wasted_tokens}"
    )


@bench_app.command("ttft")
def bench_ttft(
    model: str = typer.Option("random:qwen2.5-coder-0.5b", help=MODEL_HELP),
    db: list[str] = typer.Option(["world_1", "car_1"], help="databases (repeat the option or list them)"),
    questions: int = typer.Option(8, help="questions in total, drawn from Spider dev for the dbs"),
    wpm: float = typer.Option(40.0),
    typo_rate: float = typer.Option(0.03),
    pause: float = typer.Option(0.0, help="seconds between the last keystroke interval and Enter"),
    seed: int = typer.Option(0),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    threads: Optional[int] = typer.Option(2),
    max_new_tokens: int = typer.Option(8),
    out: Path = typer.Option(Path("bench-out/ttft")),
):
    """TTFT of cold, prefix, session(paper) and session(headstart), side by side (APITS Table III)."""
    from bench.ttft import run_ttft_bench

    run_ttft_bench(model=model, dbs=_split(db), questions=questions, wpm=wpm, typo_rate=typo_rate,
                   pause=pause, seed=seed, dtype=dtype, device=device, threads=threads,
                   max_new_tokens=max_new_tokens, out=out)


def _mount_eval() -> None:
    """`headstart eval` and `headstart eval-compare` (issue: evaluation harness)."""
    from headstart.eval.cli import compare_cli, eval_cli

    app.command("eval", help="Execution accuracy of a serving mode on Spider/BIRD (SQLite or PostgreSQL).")(eval_cli)
    app.command("eval-compare", help="Paired comparison (flips, McNemar) of several eval runs.")(compare_cli)


_mount_eval()


def _split(values: list[str]) -> list[str]:
    """Accept `--db a b` style lists as well as repeated options."""
    return [v for item in values for v in item.replace(",", " ").split()]


def main() -> None:
    # `--db world_1 car_1`: typer takes one value per option; fold the extra
    # positional values into the preceding list option before parsing.
    argv = sys.argv[1:]
    folded: list[str] = []
    list_opts = {"--db", "--dbs"}
    current = None
    for arg in argv:
        if arg.startswith("-"):
            current = arg if arg in list_opts else None
            folded.append(arg)
        elif current and folded and folded[-1] != current and not folded[-1].startswith("-"):
            folded.extend([current, arg])
        else:
            folded.append(arg)
    app(args=folded, prog_name="headstart")


if __name__ == "__main__":
    main()
