"""`headstart eval` and `headstart eval-compare`: the functions behind the commands.

`eval_command` runs one mode over one dataset and writes DIR/eval.json,
DIR/eval.md and DIR/eval.png; `compare_command` pairs several such runs.
Both return the summary dict (also what they wrote as JSON). The typer
wrappers `eval_cli` / `compare_cli` only parse options and print the table;
`headstart.cli` mounts them, and `python -m headstart.eval` runs them alone.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

from headstart.eval.compare import get_rule
from headstart.eval.compare_runs import compare_runs
from headstart.eval.dataset import load_dataset
from headstart.eval.errors import ConfigError
from headstart.eval.executors import EXECUTOR_NAMES, ExecLimits, build_executor
from headstart.eval.generators import GENERATORS, MODES, GeneratorSettings, build_generator
from headstart.eval.harness import run_eval
from headstart.eval.records import QuestionResult
from headstart.eval.report import write_run
from headstart.eval.summary import summarize

POSTGRES_DSN_ENV = "HEADSTART_POSTGRES_DSN"


def eval_command(
    *,
    out: Path,
    mode: str = "gold",
    dataset: str = "spider-dev",
    model: str = "",
    db_dir: Path | None = None,
    dbs: list[str] | None = None,
    limit: int | None = None,
    executor: str = "sqlite",
    rules: str = "spider",
    postgres_dsn: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    threads: int | None = None,
    max_new_tokens: int = 256,
    wpm: float = 40.0,
    seed: int = 0,
    speed: float | None = None,
    timeout_s: float = 30.0,
    row_limit: int = 100_000,
    progress: bool = False,
) -> dict[str, Any]:
    """Evaluate `mode` on `dataset`; write the report under `out`; return the summary.

    Raises ConfigError / DatasetError (bad options), EngineUnavailableError (a
    model mode without the engine), ExecutorError / LocalPostgresError.
    """
    rule = get_rule(rules)
    if mode not in GENERATORS:
        raise ConfigError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if executor not in EXECUTOR_NAMES:
        raise ConfigError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTOR_NAMES)}")
    if mode != "gold" and not model:
        raise ConfigError(f"mode {mode!r} needs --model (a model dir, hub id or random:<preset>)")
    limits = ExecLimits(timeout_s=timeout_s, row_limit=row_limit)
    dbs = [db.strip() for entry in dbs or [] for db in entry.split(",") if db.strip()] or None
    data = load_dataset(dataset, db_dir=db_dir, dbs=dbs, limit=limit)
    settings = GeneratorSettings(
        model=model, dtype=dtype, device=device, threads=threads, max_new_tokens=max_new_tokens,
        wpm=wpm, seed=seed, speed=speed, db_by_path=dataset != "spider-dev" or db_dir is not None,
    )
    started = time.perf_counter()
    with ExitStack() as stack:
        dsn = _postgres_dsn(stack, postgres_dsn) if executor == "postgres" else None
        runner = build_executor(executor, limits, dsn)
        stack.callback(runner.close)
        generator = build_generator(mode, settings)
        stack.callback(generator.close)
        on_row = _progress_printer(len(data.questions)) if progress else None
        rows = run_eval(data.questions, generator, runner, rule, on_row=on_row)
        notes = list(getattr(runner, "notes", []))
    summary = summarize(rows)
    if mode == "gold":
        summary["gold_sanity_passed"] = summary["n"] > 0 and summary["num_correct"] == summary["n"]
    config = {
        "mode": mode, "dataset": dataset, "model": model or None, "db_dir": str(data.db_dir) if data.db_dir else None,
        "dbs": dbs, "limit": limit, "executor": executor, "rules": rules,
        "postgres": "local (temporary)" if executor == "postgres" and not (postgres_dsn or os.environ.get(POSTGRES_DSN_ENV)) else None,
        "dtype": dtype, "device": device, "max_new_tokens": max_new_tokens, "wpm": wpm, "seed": seed, "speed": speed,
        "timeout_s": timeout_s, "row_limit": row_limit, "elapsed_s": round(time.perf_counter() - started, 3),
        "executor_notes": notes,
    }
    write_run(Path(out), config, summary, rows)
    return {**summary, "config": config}


def compare_command(runs: list[Path], out: Path) -> dict[str, Any]:
    """Pair the eval.json of `runs` (the first is the baseline); write compare.{json,md,png} under `out`."""
    return compare_runs([Path(r) for r in runs], Path(out))


def _postgres_dsn(stack: ExitStack, given: str | None) -> str:
    """The DSN given, else env HEADSTART_POSTGRES_DSN, else a temporary local server (stopped on exit)."""
    dsn = given or os.environ.get(POSTGRES_DSN_ENV)
    if dsn:
        return dsn
    from headstart.eval.local_postgres import LocalPostgres

    return stack.enter_context(LocalPostgres()).dsn


def _progress_printer(total: int):
    counts = {"done": 0, "correct": 0}

    def on_row(row: QuestionResult) -> None:
        counts["done"] += 1
        counts["correct"] += bool(row.correct)
        if counts["done"] % 50 == 0 or counts["done"] == total:
            print(f"[{counts['done']}/{total}] correct so far: {counts['correct']}", file=sys.stderr, flush=True)

    return on_row


# -- typer wrappers (options and printing only) --------------------------------

def eval_cli(
    model: str = "",
    dataset: str = "spider-dev",
    mode: str = "gold",
    out: Path = Path("out/eval"),
    db_dir: Optional[Path] = None,
    dbs: Optional[list[str]] = None,
    limit: Optional[int] = None,
    executor: str = "sqlite",
    rules: str = "spider",
    postgres_dsn: Optional[str] = None,
    dtype: Optional[str] = None,
    device: Optional[str] = None,
    threads: Optional[int] = None,
    max_new_tokens: int = 256,
    wpm: float = 40.0,
    seed: int = 0,
    speed: Optional[float] = None,
    timeout_s: float = 30.0,
    row_limit: int = 100_000,
) -> None:
    """Evaluate a serving mode on spider-dev | bird-dev | FILE.json: accuracy, exact match, TTFT."""
    import typer

    from headstart.eval.errors import EvalError
    from headstart.eval.report import HEADLINE_HEADER, HEADLINE_RULE, headline_row

    try:
        summary = eval_command(
            model=model, dataset=dataset, mode=mode, out=out, db_dir=db_dir, dbs=dbs, limit=limit,
            executor=executor, rules=rules, postgres_dsn=postgres_dsn, dtype=dtype, device=device,
            threads=threads, max_new_tokens=max_new_tokens, wpm=wpm, seed=seed, speed=speed,
            timeout_s=timeout_s, row_limit=row_limit, progress=True,
        )
    except EvalError as exc:
        typer.secho(f"error [{exc.code}]: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    typer.echo("\n".join([HEADLINE_HEADER, HEADLINE_RULE, headline_row(mode, summary)]))
    typer.echo(f"skipped {summary['skipped']} ({summary['skip_reasons']}), gold errors {summary['gold_errors']}")
    typer.echo(f"wrote {out}/eval.json, eval.md, eval.png")
    if summary.get("gold_sanity_passed") is False:
        typer.secho("gold-on-gold is below 100%: the harness is wrong", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)


def compare_cli(runs: list[Path], out: Path = Path("out/eval-compare")) -> None:
    """Pair several eval runs (first = baseline): flips right→wrong / wrong→right and McNemar's test."""
    import typer

    from headstart.eval.errors import EvalError

    try:
        compare_command(runs, out)
    except EvalError as exc:
        typer.secho(f"error [{exc.code}]: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    typer.echo((out / "compare.md").read_text(encoding="utf-8"))
