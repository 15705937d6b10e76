"""`headstart replay` (a typing trace against one engine, in this process) and `headstart demo` (a
synthetic typist in every mode, then the local stack)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from cli.common import MODEL_HELP, TABLE_CACHE_HELP, TABLE_STORE_HELP, fail, runtime_from_options
from cli.serve import serve
from headstart.config import MAX_ANSWER_TOKENS
from headstart.models.catalogue import DEFAULT_MODEL


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
):
    """The embedded default: a synthetic typist against a Spider db, in every mode."""
    from headstart.replay_modes import replay_in_mode
    from headstart.typist import Typist

    trace = Typist(wpm=wpm, typo_rate=0.03, pause_s=0.5, seed=0).trace(question)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace.jsonl").write_text(trace.to_jsonl())
    typer.echo(f"model {model}; database {db}; table cache {table_cache}; typing trace in {out / 'trace.jsonl'}")
    runtime = runtime_from_options(model=model, threads=threads, table_cache=table_cache)
    try:
        for mode in ("cold", "prefix", "session"):
            typer.secho(f"\n== {mode}: replaying {trace.submit_t:.1f} s of typing", bold=True)
            print_result(trace, replay_in_mode(runtime, db, trace, mode, max_new_tokens=MAX_ANSWER_TOKENS))
    finally:
        runtime.shutdown()
    if then_serve:
        typer.secho(f"\n== serving: open http://127.0.0.1:{port}/ and type a question about {db} (Ctrl-C stops)",
                    bold=True)
        # NOTE: every option given: a command called as a function gets no typer defaults (OptionInfo objects)
        serve(model=model, dtype="float32", device="cpu", host="127.0.0.1", port=port, grpc_port=50051,
              replicas=1, token=[], redis_url=None, max_sessions=64, threads=threads, table_cache=table_cache,
              openai_database="", ray_address=None, replica_resource=None)


def print_result(trace, result) -> None:
    """The question, the generated SQL and where its prompt's tokens were at submit."""
    typer.echo(f"question : {trace.final_text}")
    typer.echo(f"generated: {result.text!r}")
    typer.echo(
        f"TTFT {result.ttft_ms:.1f} ms | prompt {result.prompt_tokens} tokens, cached at submit "
        f"{result.cached_tokens_at_submit}, computed at submit {result.computed_tokens_at_submit}, "
        f"wasted while typing {result.wasted_tokens}"
    )
