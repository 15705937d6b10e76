"""`headstart eval` and `headstart eval-compare`: the functions behind the commands.

`eval_command` runs one mode over one dataset and writes DIR/eval.json,
DIR/eval.md and DIR/eval.png; `compare_command` pairs several such runs.
Both return the summary dict (also what they wrote as JSON). The typer
wrappers `eval_cli` / `compare_cli` only parse options and print the table;
`cli.app` mounts them, and `python -m headstart.eval` runs them alone.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

import typer

from headstart.eval.compare import get_rule
from headstart.eval.compare_runs import compare_runs
from headstart.eval.checked import CHECKED_HEADER, CHECKED_RULE, checked_row, checked_summary
from headstart.eval.dataset import load_dataset, seeded_subset
from headstart.eval.errors import ConfigError
from headstart.eval.executors import EXECUTOR_NAMES, ExecLimits, build_executor
from headstart.eval.generators import GENERATORS, MODES, GeneratorSettings, build_generator
from headstart.eval.harness import run_eval
from headstart.eval.records import QuestionResult
from headstart.eval.report import write_run
from headstart.eval.row_log import RowLog
from headstart.eval.summary import summarize
from headstart.models.catalogue import DEFAULT_MODEL

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
    pg_schema_prefix: str = "",
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
    resume: bool = False,
    candidates: int = 1,
    candidate_temperature: float = 0.7,
    candidate_top_p: float = 1.0,
    candidate_length_slack: int = 16,
    sample: int | None = None,
    sample_seed: int = 0,
) -> dict[str, Any]:
    """Evaluate `mode` on `dataset`; write the report under `out`; return the summary.

    Each answer is appended to `out`/rows.jsonl as it is scored (`row_log`);
    `resume=True` goes on from a killed run's log with the same settings
    (which questions are asked, `dbs`, `limit`, `sample`, may differ: a row
    is an answer to its question, so a sample's rows count in the full run).
    `candidates` > 1 decodes that many answers per question and reports the
    execution-checked EX beside the greedy one (`eval.checked`). `sample`
    asks `sample` questions drawn with `sample_seed` (`dataset.seeded_subset`).

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
    if candidates < 1 or (candidates > 1 and mode == "gold"):
        raise ConfigError("--candidates is 1 or more, and more than 1 only for a model mode")
    if not 0 <= candidate_length_slack <= 1_000_000:
        raise ConfigError("--candidate-length-slack is between 0 and 1000000 tokens")
    data = load_dataset(dataset, db_dir=db_dir, dbs=dbs, limit=limit)
    if sample is not None:
        data = seeded_subset(data, sample, sample_seed)
    settings = GeneratorSettings(
        model=model, dtype=dtype, device=device, threads=threads, max_new_tokens=max_new_tokens,
        wpm=wpm, seed=seed, speed=speed, db_by_path=dataset != "spider-dev" or db_dir is not None,
        candidates=candidates, candidate_temperature=candidate_temperature, candidate_top_p=candidate_top_p,
        candidate_length_slack=candidate_length_slack,
    )
    answers_depend_on = {
        "mode": mode, "dataset": dataset, "model": model or None, "db_dir": str(data.db_dir) if data.db_dir else None,
        "executor": executor, "rules": rules, "pg_schema_prefix": pg_schema_prefix,
        "dtype": dtype, "device": device, "max_new_tokens": max_new_tokens, "wpm": wpm, "seed": seed, "speed": speed,
        "timeout_s": timeout_s, "row_limit": row_limit,
        **({"candidates": candidates, "candidate_temperature": candidate_temperature,
            "candidate_top_p": candidate_top_p, "candidate_length_slack": candidate_length_slack}
           if candidates > 1 else {}),
    }
    selection = {"dbs": dbs, "limit": limit, "sample": sample, "sample_seed": sample_seed if sample else None}
    log = RowLog(Path(out), answers_depend_on, resume=resume)
    with ExitStack() as stack:
        stack.callback(log.close)
        dsn = _postgres_dsn(stack, postgres_dsn) if executor == "postgres" else None
        runner = build_executor(executor, limits, dsn, pg_schema_prefix)
        stack.callback(runner.close)
        if len(set(log.done) & {q.index for q in data.questions}) < len(data.questions):  # else: no model needed
            generator = build_generator(mode, settings)
            stack.callback(generator.close)
        else:
            generator = _NothingLeft()
        asked = {q.index for q in data.questions}
        done = {i: row for i, row in log.done.items() if i in asked}  # a resumed run may hold other questions too
        progress_row = _progress_printer(len(data.questions), done) if progress else None

        def on_row(row: QuestionResult) -> None:
            log.append(row)
            if progress_row is not None:
                progress_row(row)

        rows = run_eval(data.questions, generator, runner, rule, on_row=on_row, done=done)
        notes = list(getattr(runner, "notes", []))
    summary = summarize(rows)
    checked = checked_summary(rows)
    if checked is not None:
        summary["checked"] = checked
    if mode == "gold":
        summary["gold_sanity_passed"] = summary["n"] > 0 and summary["num_correct"] == summary["n"]
    config = {
        **answers_depend_on, **selection, "postgres": _postgres_label(executor, postgres_dsn),
        "elapsed_s": round(log.elapsed_s(), 3), "segments": log.segment + 1, "resumed_rows": len(log.done),
        "threads": threads, "executor_notes": notes,
    }
    write_run(Path(out), config, summary, rows)
    log.finish()
    return {**summary, "config": config}


class _NothingLeft:
    """The generator of a resumed run whose log already has every answer (never asked)."""

    mode = "resumed"

    def warmup(self, question: Any) -> None:
        return None

    def generate(self, question: Any) -> Any:
        raise AssertionError("every answer was in the row log")

    def close(self) -> None:
        return None


def compare_command(runs: list[Path], out: Path) -> dict[str, Any]:
    """Pair the eval.json of `runs` (the first is the baseline); write compare.{json,md,png} under `out`."""
    return compare_runs([Path(r) for r in runs], Path(out))


def _postgres_label(executor: str, given: str | None) -> str | None:
    """How the report names the PostgreSQL used (never the DSN itself: it may hold a password)."""
    if executor != "postgres":
        return None
    return "configured DSN" if given or os.environ.get(POSTGRES_DSN_ENV) else "local (temporary)"


def _postgres_dsn(stack: ExitStack, given: str | None) -> str:
    """The DSN given, else env HEADSTART_POSTGRES_DSN, else a temporary local server (stopped on exit)."""
    dsn = given or os.environ.get(POSTGRES_DSN_ENV)
    if dsn:
        return dsn
    from headstart.eval.local_postgres import LocalPostgres

    return stack.enter_context(LocalPostgres()).dsn


def _progress_printer(total: int, done: dict[int, QuestionResult] | None = None):
    done = done or {}
    already = len(done)
    counts = {"done": already, "correct": sum(bool(r.correct) for r in done.values()),
              "checked": sum(bool((r.extra.get("checked") or {}).get("correct")) for r in done.values())}
    if already:
        print(f"[{already}/{total}] resumed from the row log", file=sys.stderr, flush=True)

    def on_row(row: QuestionResult) -> None:
        counts["done"] += 1
        counts["correct"] += bool(row.correct)
        counts["checked"] += bool((row.extra.get("checked") or {}).get("correct"))
        if counts["done"] % 50 == 0 or counts["done"] == total:
            checked = f", checked: {counts['checked']}" if row.extra.get("checked") is not None else ""
            print(f"[{counts['done']}/{total}] correct so far: {counts['correct']}{checked}", file=sys.stderr, flush=True)

    return on_row


# -- typer wrappers (options and printing only) --------------------------------

MODEL_HELP = ("a catalogue model, a .gguf file, a model dir, a hub id, or random:<preset> "
              f"(default {DEFAULT_MODEL}; not used by --mode gold)")


def eval_cli(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dataset: str = typer.Option("spider-dev", help="spider-dev | bird-dev | FILE.json ({question, query, db_id} list)"),
    mode: str = typer.Option("gold", help=f"serving path: {' | '.join(MODES)}"),
    out: Path = typer.Option(Path("out/eval"), help="folder for eval.json, eval.md, eval.png"),
    db_dir: Optional[Path] = typer.Option(None, help="SQLite files as DIR/<db_id>/<db_id>.sqlite (+ DIR/tables.json)"),
    dbs: Optional[list[str]] = typer.Option(None, help="only these db ids (repeat or comma-separate)"),
    limit: Optional[int] = typer.Option(None, help="first N questions (after --dbs), skipped ones included"),
    executor: str = typer.Option("sqlite", help="sqlite | postgres"),
    rules: str = typer.Option("spider", help="spider (multiset, ORDER BY-aware, columns permutable; DISTINCT kept) | spider-official (the official evaluator's default: DISTINCT deleted, spaced operators repaired) | bird (set)"),
    postgres_dsn: Optional[str] = typer.Option(
        None, help=f"PostgreSQL for --executor postgres (default env {POSTGRES_DSN_ENV}, else a temporary local one)"),
    pg_schema_prefix: str = typer.Option("", help="PostgreSQL schema of a db: <prefix><db_id>"),
    dtype: Optional[str] = typer.Option(None, help="engine dtype (float32 | bfloat16 | float16 | float64)"),
    device: Optional[str] = typer.Option(None, help="engine device (cpu | cuda | cuda:N)"),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads"),
    max_new_tokens: int = typer.Option(256, help="longest answer generated"),
    wpm: float = typer.Option(40.0, help="session mode: typing speed of the synthetic typist"),
    seed: int = typer.Option(0, help="session mode: typist seed (per question: sha256(seed, question id))"),
    speed: Optional[float] = typer.Option(None, help="session mode: replay speed (default real time)"),
    timeout_s: float = typer.Option(30.0, help="per-query timeout, gold and predicted"),
    row_limit: int = typer.Option(100_000, help="most rows a query may return"),
    resume: bool = typer.Option(False, "--resume", help="go on from OUT/rows.jsonl, a killed run's answers (same options)"),
    candidates: int = typer.Option(1, help="answers per question: the greedy one and candidates-1 sampled ones; "
                                   "reports the execution-checked EX beside the greedy EX"),
    candidate_temperature: float = typer.Option(0.7, help="the sampled candidates' temperature"),
    candidate_top_p: float = typer.Option(1.0, help="the sampled candidates' top-p"),
    candidate_length_slack: int = typer.Option(16, help="a sampled candidate is bounded at the greedy answer's "
                                               "length + this many tokens (1000000: no bound)"),
    sample: Optional[int] = typer.Option(None, help="N questions drawn with --sample-seed (after --dbs/--limit)"),
    sample_seed: int = typer.Option(0, help="the seed of --sample"),
) -> None:
    """Evaluate a serving mode on spider-dev | bird-dev | FILE.json: accuracy, exact match, TTFT."""
    from headstart.eval.errors import EvalError
    from headstart.eval.report import HEADLINE_HEADER, HEADLINE_RULE, headline_row

    try:
        summary = eval_command(
            model=model, dataset=dataset, mode=mode, out=out, db_dir=db_dir, dbs=dbs, limit=limit,
            executor=executor, rules=rules, postgres_dsn=postgres_dsn, pg_schema_prefix=pg_schema_prefix,
            dtype=dtype, device=device,
            threads=threads, max_new_tokens=max_new_tokens, wpm=wpm, seed=seed, speed=speed,
            timeout_s=timeout_s, row_limit=row_limit, progress=True, resume=resume, candidates=candidates,
            candidate_temperature=candidate_temperature, candidate_top_p=candidate_top_p,
            candidate_length_slack=candidate_length_slack, sample=sample,
            sample_seed=sample_seed,
        )
    except EvalError as exc:
        typer.secho(f"error [{exc.code}]: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    typer.echo("\n".join([HEADLINE_HEADER, HEADLINE_RULE, headline_row(mode, summary)]))
    if "checked" in summary:
        typer.echo("\n".join(["", CHECKED_HEADER, CHECKED_RULE, checked_row(summary["checked"])]))
    typer.echo(f"skipped {summary['skipped']} ({summary['skip_reasons']}), gold errors {summary['gold_errors']}")
    typer.echo(f"wrote {out}/eval.json, eval.md, eval.png")
    if summary.get("gold_sanity_passed") is False:
        typer.secho("gold-on-gold is below 100%: the harness is wrong", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)


def compare_cli(
    runs: list[Path] = typer.Argument(..., help="run folders (or eval.json files); the first is the baseline"),
    out: Path = typer.Option(Path("out/eval-compare"), help="folder for compare.json, compare.md, compare.png"),
) -> None:
    """Pair several eval runs (first = baseline): flips right→wrong / wrong→right and McNemar's test."""
    from headstart.eval.errors import EvalError

    try:
        compare_command(runs, out)
    except EvalError as exc:
        typer.secho(f"error [{exc.code}]: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    typer.echo((out / "compare.md").read_text(encoding="utf-8"))


def rescore_cli(
    run: Path = typer.Argument(..., help="a run folder (or its eval.json) to score again"),
    rules: str = typer.Option("spider-official", help="the rule set to score it under: spider | spider-official | bird"),
    out: Path = typer.Option(Path("out/eval-rescored"), help="folder for the rescored eval.json, eval.md, eval.png"),
    candidates: Optional[int] = typer.Option(None, help="score a --candidates K run as if it had decoded k <= K "
                                             "(its first k candidates: they are seeded per index)"),
    candidate_length_slack: Optional[int] = typer.Option(
        None, help="bound the sampled candidates at the greedy answer's length + this many tokens, as a run "
        "with that slack does (a run recorded with a slack takes a tighter one)"),
) -> None:
    """Score a finished run's recorded answers again under other rules (nothing is generated again)."""
    from headstart.eval.errors import EvalError
    from headstart.eval.report import HEADLINE_HEADER, HEADLINE_RULE, headline_row
    from headstart.eval.rescore import rescore_command

    try:
        summary = rescore_command(run, rules, out, candidates, candidate_length_slack)
    except EvalError as exc:
        typer.secho(f"error [{exc.code}]: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    typer.echo("\n".join([HEADLINE_HEADER, HEADLINE_RULE, headline_row(summary["config"]["mode"], summary)]))
    if "checked" in summary:
        typer.echo("\n".join(["", CHECKED_HEADER, CHECKED_RULE, checked_row(summary["checked"])]))
    typer.echo(f"wrote {out}/eval.json, eval.md, eval.png ({rules} rules)")
