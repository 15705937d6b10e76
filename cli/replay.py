"""`headstart replay` (a typing trace against one engine, in this process) and `headstart demo` (a
synthetic typist in every mode, then the local stack)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from cli.common import MODEL_HELP, TABLE_CACHE_HELP, TABLE_STORE_HELP, fail, runtime_from_options
from headstart.config import MAX_ANSWER_TOKENS
from headstart.models.catalogue import DEFAULT_MODEL

DEMO_CANDIDATES = 8  # the demo's answers are execution-checked among this many
DEMO_ROWS = 10  # rows of a checked answer printed


def replay(
    trace: Path = typer.Option(..., help="typing trace (JSON lines: {t, text} ..., {t, submit: true})"),
    db: str = typer.Option("world_1", help="Spider db id, SQLite path or PostgreSQL DSN"),
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    policy: str = typer.Option("headstart", help="confirmation policy: headstart | paper"),
    mode: str = typer.Option("session", help="cold | prefix | session"),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads"),
    max_new_tokens: int = typer.Option(MAX_ANSWER_TOKENS, help="the cap on the answer's tokens (it ends at EOS)"),
    speed: float = typer.Option(1.0, help="replay speed: 4 = four times faster than recorded"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the result as JSON here"),
    table_cache: str = typer.Option("off", help=TABLE_CACHE_HELP),
    table_store: str = typer.Option("memory://", help=TABLE_STORE_HELP),
):
    """Replay a typing trace in real time and print the SQL and the time to first token."""
    from headstart.engine.errors import HeadstartError
    from headstart.models import ModelLoadError
    from headstart.replay_modes import replay_in_mode
    from headstart.schema import SchemaError
    from headstart.trace import TraceError, load_trace

    try:
        parsed = load_trace(trace)
        runtime = runtime_from_options(model=model, dtype=dtype, device=device, threads=threads,
                                       table_cache=table_cache, table_store_url=table_store)
        try:
            result = replay_in_mode(runtime, db, parsed, mode, policy, max_new_tokens, speed)
        finally:
            runtime.shutdown()
    except (TraceError, SchemaError, ModelLoadError, HeadstartError, ValueError) as exc:
        fail(str(exc))
    out = {
        "db": db, "mode": mode, "policy": policy if mode == "session" else None, "model": model,
        "table_cache": table_cache,
        "token_ids": result.token_ids, "text": result.text, "ttft_ms": result.ttft_ms,
        "total_ms": result.total_ms, "prompt_tokens": result.prompt_tokens,
        "cached_tokens_at_submit": result.cached_tokens_at_submit,
        "computed_tokens_at_submit": result.computed_tokens_at_submit,
        "wasted_tokens": result.wasted_tokens, **result.extra,
    }
    print_result(parsed, result)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(out, indent=2))


def demo(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    db: str = typer.Option("world_1"),
    question: str = typer.Option("How many cities are there in each country?"),
    wpm: float = typer.Option(60.0),
    threads: Optional[int] = typer.Option(None),
    out: Path = typer.Option(Path(".headstart/demo"), help="where the generated trace goes"),
    table_cache: str = typer.Option("off", help=TABLE_CACHE_HELP),
    then_serve: bool = typer.Option(True, "--serve/--no-serve", help="then start the local stack (Ctrl-C stops)"),
    port: int = typer.Option(8080, help="HTTP port of the page when serving"),
    candidates: int = typer.Option(DEMO_CANDIDATES, "--candidates", min=1,
                                   help="answers decoded per question (the greedy one and K-1 sampled ones); each "
                                   "one's SQL is run read-only and the result most of them return is shown, with "
                                   "its rows (1: the greedy answer alone, run)"),
):
    """The embedded default: a synthetic typist against a Spider db, in every mode; each mode's
    execution-checked answer is printed with its first rows."""
    from cli.enter_report import enter_report, forwards
    from headstart.candidates import CandidateLimits, CheckedAnswers
    from headstart.engine.errors import HeadstartError
    from headstart.engine.requests.candidates import CandidateParams
    from headstart.replay_modes import replay_in_mode
    from headstart.typist import Typist

    trace = Typist(wpm=wpm, typo_rate=0.03, pause_s=0.5, seed=0).trace(question)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace.jsonl").write_text(trace.to_jsonl())
    typer.echo(f"model {model}; database {db}; table cache {table_cache}; {candidates} candidates per answer; "
               f"typing trace in {out / 'trace.jsonl'}")
    # the forward trace says what the engine was doing at Enter (the session mode's line under its TTFT)
    forward_log = out / "forwards.jsonl"
    forward_log.unlink(missing_ok=True)
    runtime = runtime_from_options(model=model, threads=threads, table_cache=table_cache, trace_forwards=forward_log)
    opened = runtime.worker.trace.opened
    s = runtime.settings
    # wait_all: the demo shows the choice among all K (the page's default takes those ready at Enter)
    cands = CandidateParams(candidates, s.candidate_temperature, s.candidate_top_p, wait_all=True,
                            length_slack=s.candidate_length_slack) \
        if candidates > 1 else None
    checked = CheckedAnswers(s.spider_dir, CandidateLimits(display_rows=DEMO_ROWS))

    def check(request) -> dict:  # replay_in_mode's checker: the choice, timed from Enter as the TTFT is
        choice = checked.check(db, request, wait_all=True).result()
        return {"choice": choice, "checked_ms": (time.perf_counter() - request.started) * 1000.0,
                "enter_t": request.started - opened, "first_token_t": request.first_token_at - opened}

    try:
        checked.sqlite_path(db)
    except HeadstartError as exc:  # PostgreSQL: candidates are checked on SQLite files only
        typer.echo(f"note: {exc}: the greedy answers are shown unchecked")
        cands, check = None, None
    try:
        results = {}
        for mode in ("cold", "prefix", "session"):
            typer.secho(f"\n== {mode}: replaying {trace.submit_t:.1f} s of typing", bold=True)
            results[mode] = replay_in_mode(runtime, db, trace, mode, max_new_tokens=MAX_ANSWER_TOKENS,
                                           candidates=cands, checker=check)
            print_result(trace, results[mode])
            if mode == "session" and check is not None:
                extra = results[mode].extra
                typer.echo("why      : " + enter_report(forwards(forward_log), extra["enter_t"],
                                                        extra["first_token_t"], extra["answer_tokens_ready_at_submit"]))
    finally:
        checked.close()
        runtime.shutdown()
    if then_serve:
        typer.secho("\n== serving: starting the local stack (Ray, the engine, the gateway)", bold=True)
        page = f"?candidates={candidates}" if candidates > 1 else ""

        def say_open(stack) -> None:  # once the gateway answers: the page is there to open
            typer.secho(f"\n== open {stack.http_url}/{page} and type a question about {db} (Ctrl-C stops)",
                        bold=True)

        from services.launcher import serve_command  # Ray Serve and FastAPI: seconds to import

        serve_command(model=model, dtype="float32", host="127.0.0.1", port=port, grpc_port=50051, replicas=1,
                      tokens=[], device="cpu", redis_url=None, max_sessions=64, threads=threads,
                      table_cache=table_cache, openai_database="", block=True, ray_address=None,
                      replica_resource=None, say=typer.echo, on_ready=say_open, quiet=True)


def print_result(trace, result) -> None:
    """The question, the generated SQL (as extracted from the answer, the eval's way), where its
    prompt's tokens were at submit, and with a checked choice in `extra`, the chosen SQL and its rows."""
    from headstart.eval.extract import extract_sql

    typer.echo(f"question : {trace.final_text}")
    typer.echo(f"generated: {_indented(extract_sql(result.text))}")
    typer.echo(
        f"TTFT {result.ttft_ms:.1f} ms | prompt {result.prompt_tokens} tokens, cached at submit "
        f"{result.cached_tokens_at_submit}, computed at submit {result.computed_tokens_at_submit}, "
        f"wasted while typing {result.wasted_tokens}"
    )
    choice = result.extra.get("choice")
    if choice is not None:
        print_choice(choice, result.extra["checked_ms"])


def print_choice(choice, checked_ms: float) -> None:
    """A checked answer: the chosen SQL, how many candidates agreed, its first rows as a table."""
    failed = f", {len(choice.failed)} failed" if choice.failed else ""
    if choice.error is not None:
        typer.echo(f"checked  : no candidate's SQL ran ({choice.num_candidates} checked): {choice.error}")
        return
    which = "the greedy answer" if not choice.changed else f"sampled candidate {choice.index}"
    typer.echo(f"checked  : {_indented(choice.sql)}")
    typer.echo(f"           {which}; {choice.agreed} of {choice.num_candidates} candidates return this result"
               f"{failed}; chosen {checked_ms:.0f} ms after Enter")
    chosen = next((o for o in choice.outcomes if o.index == choice.index), None)
    num_rows = chosen.num_rows if chosen is not None else len(choice.rows)
    for line in format_rows(choice.columns, choice.rows, num_rows):
        typer.echo(f"           {line}")


def format_rows(columns, rows, num_rows: int) -> list[str]:
    """A small text table: a header, a rule, the rows given, and how many more there are."""
    cells = [[str(c) for c in columns]] + [["NULL" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [" | ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    shown = len(rows)
    lines.append(f"({num_rows} row{'s' if num_rows != 1 else ''}" +
                 (f", first {shown} shown)" if num_rows > shown else ")"))
    return lines


def _indented(sql: str) -> str:
    """Multi-line SQL, its later lines under the first (after the 11-character labels)."""
    return sql.replace("\n", "\n" + " " * 11)
