"""`headstart`: the one entry point for every command a user runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from headstart.config import MAX_ANSWER_TOKENS
from headstart.models.catalogue import DEFAULT_MODEL
from headstart.models.cli import model_app
from headstart.peer.cli import peer_app
from headstart.tables.cli import tables_app
from services.deploy.cli import deploy_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (they print a table, write JSON and a plot).")
app.add_typer(bench_app, name="bench")
app.add_typer(peer_app, name="peer")
app.add_typer(tables_app, name="tables")
app.add_typer(deploy_app, name="deploy")
app.add_typer(model_app, name="model")

MODEL_HELP = ("a catalogue model (`headstart model list`: qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct), "
              "a .gguf file, a local HF model dir, a hub id, or random:<preset> (tiny, qwen2.5-coder-0.5b|1.5b|3b|7b: "
              "real shapes, random weights, for tests)")
TABLE_CACHE_MODES = ("off", "pfk", "independent")
TABLE_CACHE_HELP = "table blocks for P0 and completions: off | pfk (foreign-key groups) | independent"
FAST_PATH_CASES = ("off", "eager", "onednn", "native", "inductor", "auto")
TABLE_STORE_HELP = "table block store: memory:// or redis://host:port/db"


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@app.command()
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
    from headstart.schema import SchemaError
    from headstart.trace import TraceError, load_trace

    try:
        parsed = load_trace(trace)
        from headstart.replay_modes import replay_in_mode

        runtime = _runtime(model=model, dtype=dtype, device=device, threads=threads,
                           table_cache=table_cache, table_store_url=table_store)
        try:
            result = replay_in_mode(runtime, db, parsed, mode, policy, max_new_tokens, speed)
        finally:
            runtime.shutdown()
    except (TraceError, SchemaError, ModelLoadError, HeadstartError, ValueError) as exc:
        _fail(str(exc))
    out = {
        "db": db, "mode": mode, "policy": policy if mode == "session" else None, "model": model,
        "table_cache": table_cache,
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
    runtime = _runtime(model=model, threads=threads, table_cache=table_cache)
    try:
        for mode in ("cold", "prefix", "session"):
            typer.secho(f"\n== {mode}: replaying {trace.submit_t:.1f} s of typing", bold=True)
            _print_result(trace, replay_in_mode(runtime, db, trace, mode, max_new_tokens=MAX_ANSWER_TOKENS))
    finally:
        runtime.shutdown()
    if then_serve:
        typer.secho(f"\n== serving: open http://127.0.0.1:{port}/ and type a question about {db} (Ctrl-C stops)",
                    bold=True)
        serve(model=model, dtype="float32", device="cpu", host="127.0.0.1", port=port, grpc_port=50051,
              replicas=1, token=[], redis_url=None, max_sessions=64, threads=threads, table_cache=table_cache)


@app.command()
def serve(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    host: str = typer.Option("127.0.0.1", help="gateway bind address (loopback only without --token)"),
    port: int = typer.Option(8080, help="HTTP port: page, REST, WebSocket, /healthz, /metrics"),
    grpc_port: int = typer.Option(50051, help="public gRPC port"),
    replicas: int = typer.Option(1, help="engine replicas (Ray Serve, sticky by session id)"),
    token: list[str] = typer.Option([], help="bearer token, TOKEN or TENANT=TOKEN (repeat)"),
    redis_url: Optional[str] = typer.Option(None, "--redis", help="redis:// URL of the data sessions' store "
                                            "(default $HEADSTART_REDIS_URL; neither: an embedded one is started)"),
    max_sessions: int = typer.Option(64, help="sessions per replica"),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads per replica (default: cores / replicas)"),
    table_cache: str = typer.Option("off", help=TABLE_CACHE_HELP),
    openai_database: str = typer.Option("", help="database of an OpenAI completion that names none "
                                        "(default: the request must name it, body field `database`)"),
):
    """Start the local stack: Ray, the engine deployment, the gateway (and Redis). Ctrl-C stops it all."""
    from services.launcher import serve_command

    if table_cache not in TABLE_CACHE_MODES:
        _fail(f"unknown --table-cache {table_cache!r}; valid: {', '.join(TABLE_CACHE_MODES)}")
    serve_command(model=model, dtype=dtype, host=host, port=port, grpc_port=grpc_port, replicas=replicas,
                  tokens=token, device=device, redis_url=redis_url, max_sessions=max_sessions, threads=threads,
                  table_cache=table_cache, openai_database=openai_database, block=True, say=typer.echo)


def _runtime(**settings):
    """An EngineRuntime from CLI options; a bad option value exits with code 2 and a clear message."""
    from pydantic import ValidationError

    from headstart.build import build_runtime
    from headstart.config import EngineSettings

    try:
        parsed = EngineSettings(**settings)
    except ValidationError as exc:
        _fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    return build_runtime(parsed)


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
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    db: list[str] = typer.Option(["world_1", "car_1"], help="databases (repeat the option or list them)"),
    questions: int = typer.Option(8, help="questions in total, drawn from Spider dev for the dbs"),
    wpm: float = typer.Option(40.0),
    typo_rate: float = typer.Option(0.03),
    pause: float = typer.Option(0.0, help="seconds between the last keystroke interval and Enter"),
    seed: int = typer.Option(0),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    threads: Optional[int] = typer.Option(2),
    max_new_tokens: int = typer.Option(MAX_ANSWER_TOKENS, help="the cap on an answer's tokens (answers end at EOS): "
                                       "the table shows the p50 time to the complete answer per mode"),
    out: Path = typer.Option(Path("bench-out/ttft")),
    table_cache: str = typer.Option("off", help=TABLE_CACHE_HELP),
    llamacpp: str = typer.Option("auto", help="llama.cpp peer mode: auto (when a llama.cpp server is available), on, off"),
    llamacpp_server: str = typer.Option("auto", help="which llama.cpp server: cpp (llama-server, `headstart peer "
                                                     "build-server`), python (llama-cpp-python), auto (cpp when built)"),
    fast_path: str = typer.Option("auto", help="kernels of every mode's forwards (HEADSTART_FAST_PATH): "
                                  "off | auto | eager | onednn | inductor"),
):
    """TTFT of cold, prefix, session(paper) and session(headstart), side by side (APITS Table III)."""
    from bench.ttft import run_ttft_bench

    if table_cache not in TABLE_CACHE_MODES:
        _fail(f"unknown --table-cache {table_cache!r}; valid: {', '.join(TABLE_CACHE_MODES)}")
    from headstart.peer.gguf_convert import PeerUnavailable

    try:
        run_ttft_bench(model=model, dbs=_split(db), questions=questions, wpm=wpm, typo_rate=typo_rate,
                       pause=pause, seed=seed, dtype=dtype, device=device, threads=threads,
                       max_new_tokens=max_new_tokens, out=out, table_cache=table_cache, llamacpp=llamacpp,
                       fast_path=fast_path, llamacpp_server=llamacpp_server)
    except (PeerUnavailable, ValueError) as exc:  # --llamacpp on without the extra, or a bad choice
        _fail(str(exc))


@bench_app.command("decode-step")
def bench_decode_step(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: list[str] = typer.Option(["float32", "bfloat16"], help="dtypes (repeat the option or list them)"),
    kernels: list[str] = typer.Option(["off", "eager", "onednn", "inductor"],
                                      help=f"fast paths to compare: {', '.join(FAST_PATH_CASES)}"),
    rows: list[int] = typer.Option([1, 8], help="decode rows sharing one forward (repeat)"),
    steps: int = typer.Option(24, help="decode steps timed per case"),
    prompt_tokens: int = typer.Option(600, help="tokens in the warm cache the steps extend"),
    threads: Optional[int] = typer.Option(2),
    out: Path = typer.Option(Path("bench-out/decode-step")),
):
    """One decode step per kernel choice (HEADSTART_FAST_PATH), dtype and batch size."""
    from bench.decode_step import run_decode_step_bench

    try:
        run_decode_step_bench(model, _split(dtype), _split(kernels), rows, steps, prompt_tokens, threads, out)
    except ValueError as exc:
        _fail(str(exc))


@bench_app.command("batch-invariance")
def bench_batch_invariance(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: list[str] = typer.Option(["float32", "bfloat16"], help="dtypes (repeat the option or list them)"),
    kernels: list[str] = typer.Option(["eager", "onednn"], help="fast paths (eager, onednn, native, inductor)"),
    rows: int = typer.Option(4, help="rows of the batched forward (caches of different lengths)"),
    new_tokens: int = typer.Option(3, help="most new tokens per row"),
    repeats: int = typer.Option(5, help="batched forwards timed per case (min reported)"),
    threads: Optional[int] = typer.Option(2),
    out: Path = typer.Option(Path("bench-out/batch-invariance")),
):
    """Largest |batched row - lone forward| logit, HEADSTART_BATCH_INVARIANT off and on, and its cost."""
    from bench.batch_invariance import run_batch_invariance_bench

    try:
        run_batch_invariance_bench(model, _split(dtype), _split(kernels), rows, new_tokens, repeats, threads, out)
    except ValueError as exc:
        _fail(str(exc))


@bench_app.command("memory")
def bench_memory(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    db: str = typer.Option("world_1"),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    threads: Optional[int] = typer.Option(2),
    budget_mib: float = typer.Option(32.0, help="KV budget the sessions are opened against"),
    rows: int = typer.Option(8, help="rows of the measured batched forward"),
    new_tokens: int = typer.Option(3, help="new tokens per row of that forward"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("bench-out/memory")),
):
    """KV bytes per token, sessions per KV budget (P0 shared vs copied), batched-forward peak memory."""
    from bench.memory import run_memory_bench

    run_memory_bench(model, db, dtype, device, threads, budget_mib, rows, new_tokens, seed, out)


@bench_app.command("serve")
def bench_serve(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    replicas: int = typer.Option(1),
    concurrency: list[int] = typer.Option([1, 4, 8], help="numbers of concurrent typists (repeat)"),
    rounds: int = typer.Option(3, help="questions per typist and mode; the modes alternate round by round"),
    wpm: float = typer.Option(60.0),
    pause: float = typer.Option(0.3),
    max_new_tokens: int = typer.Option(MAX_ANSWER_TOKENS, help="the cap on an answer's tokens (answers end at EOS)"),
    db: str = typer.Option("world_1"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("bench-out/serve")),
    llamacpp: str = typer.Option("auto", help="llama.cpp peer rows: auto (when a llama.cpp server is available), on, off"),
    llamacpp_server: str = typer.Option("auto", help="which llama.cpp server: cpp (llama-server with -np N at each N; "
                                                     "`headstart peer build-server`), python (llama-cpp-python, one "
                                                     "request at a time), auto (cpp when built)"),
):
    """N concurrent typists (WebSocket and gRPC) against the local stack, vs the prefix baseline."""
    from bench.serve import run_serve_bench

    from headstart.peer.gguf_convert import PeerUnavailable

    try:
        run_serve_bench(out, model=model, dtype=dtype, device=device, replicas=replicas,
                        concurrency=tuple(concurrency), rounds=rounds, wpm=wpm, pause_s=pause,
                        max_new_tokens=max_new_tokens, db=db, seed=seed, say=typer.echo, llamacpp=llamacpp,
                        llamacpp_server=llamacpp_server)
    except (PeerUnavailable, ValueError) as exc:  # --llamacpp on without a llama.cpp server, or a bad choice
        _fail(str(exc))


def _mount_neighbour() -> None:
    try:  # issue 16: noisy-neighbour benchmark (bench/ sits beside the package in a checkout)
        from bench.neighbour_cli import bench_neighbour
    except ImportError:
        return
    bench_app.command("neighbour")(bench_neighbour)


_mount_neighbour()


@bench_app.command("data")
def bench_data(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: str = typer.Option("float32"),
    threads: int = typer.Option(2),
    steps: str = typer.Option("0,25,50,100,200", help="rows in the cache at each latency point"),
    repeats: int = typer.Option(5),
    new_tokens: int = typer.Option(8, help="answer tokens in the retention comparison"),
    latency_tokens: int = typer.Option(1, help="answer tokens in the latency points"),
    retention_rows: int = typer.Option(120),
    retention_batch: int = typer.Option(10),
    bound: int = typer.Option(600, help="retention bound in tokens"),
    seed: int = typer.Option(0),
    answer_tokens: int = typer.Option(96, help="cap of the whole answers scored for accuracy per retention mode"),
    out: Path = typer.Option(Path("bench-out/data")),
):
    """Data sessions: query latency vs rows in the cache; retention shift vs rebuild (drift, cost)."""
    from bench.data_sessions import run_data_bench

    run_data_bench(out, model, dtype, threads, [int(s) for s in steps.split(",")], repeats, new_tokens,
                   latency_tokens, retention_rows, retention_batch, bound, seed, answer_tokens)


@bench_app.command("ready-exit")
def bench_ready_exit(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    db: list[str] = typer.Option(["concert_singer", "pets_1", "orchestra", "employee_hire_evaluation"],
                                 help="Spider databases streamed into data sessions (those with stream questions)"),
    batches: int = typer.Option(3, help="ingestion batches per database: one ready position each"),
    max_rows: int = typer.Option(48, help="rows streamed per database at most"),
    spider: int = typer.Option(2, help="Spider dev questions per batch (besides 3 stream questions)"),
    max_new_tokens: int = typer.Option(64, help="the cap on a full answer (answers end at EOS)"),
    threads: int = typer.Option(2),
    seed: int = typer.Option(0),
    out: Path = typer.Option(Path("bench-out/ready-exit")),
):
    """Data sessions' ready-position exit on Spider: the ready gap per threshold, its top token, exits right."""
    from bench.ready_exit import run_ready_exit_bench

    try:
        run_ready_exit_bench(out, model, _split(db), batches, max_rows, spider, max_new_tokens, threads, seed)
    except ValueError as exc:  # a database without stream questions
        _fail(str(exc))


@bench_app.command("stream")
def bench_stream(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    threads: int = typer.Option(2),
    rows_start: int = typer.Option(20, help="rows before the first iteration (the paper's scale: 100)"),
    rows_per_iteration: int = typer.Option(11, help="new rows before each query (the paper's scale: 55)"),
    iterations: int = typer.Option(15),
    new_tokens: int = typer.Option(8, help="answer tokens per query"),
    shift_bound: int = typer.Option(256, help="retention bound (tokens) of the shift-drift session"),
    repeats: int = typer.Option(1, help="queries per mode per iteration, median (noisy hosts)"),
    seed: int = typer.Option(0),
    redis_url: str = typer.Option(None, help="Redis for the flash answers (default: start a local one)"),
    out: Path = typer.Option(Path("bench-out/stream")),
):
    """Streaming rows + one query per iteration: re-prefill vs prefix cache vs stateful session vs flash hit."""
    from bench.stream import run_stream_bench

    run_stream_bench(out, model, dtype, device, threads, rows_start, rows_per_iteration, iterations, new_tokens,
                     shift_bound, seed, redis_url, repeats)


def _mount_eval() -> None:
    """`headstart eval` and `headstart eval-compare` (issue: evaluation harness)."""
    from headstart.eval.cli import compare_cli, eval_cli, rescore_cli

    app.command("eval", help="Execution accuracy of a serving mode on Spider/BIRD (SQLite or PostgreSQL).")(eval_cli)
    app.command("eval-compare", help="Paired comparison (flips, McNemar) of several eval runs.")(compare_cli)
    app.command("eval-rescore", help="Score a finished run's answers again under other rules.")(rescore_cli)


_mount_eval()
from loadtest.run import loadtest_cli  # noqa: E402 (`headstart loadtest`: Locust scenarios)

app.command("loadtest")(loadtest_cli)


@bench_app.command("prompt-lookup")
def bench_prompt_lookup(
    run: Path = typer.Option(..., help="a finished `headstart eval` run (its folder): the answers replayed"),
    model: str = typer.Option(DEFAULT_MODEL, help="the model whose forwards are timed (the run's)"),
    limit: int = typer.Option(300, help="answers replayed (the run's first N scored questions)"),
    out: Path = typer.Option(Path("bench-out/prompt-lookup")),
):
    """Prompt-lookup drafts: tokens per forward on real answers and decode time vs no drafts, per kernel level."""
    from bench.prompt_lookup import run_prompt_lookup_bench

    try:
        run_prompt_lookup_bench(run, out, model, limit)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))


@bench_app.command("tables")
def bench_tables(
    dataset: str = typer.Option("spider-dev", help="spider-dev | bird-dev"),
    questions: int = typer.Option(40, help="questions, drawn in seeded random order"),
    seed: int = typer.Option(0, help="seeds the question order and every question's table order"),
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    threads: Optional[int] = typer.Option(2),
    store: str = typer.Option("auto", help="block store: auto (a private local Redis, else memory://) or a URL"),
    device_tier_mib: float = typer.Option(32.0, help="device tier budget for blocks"),
    prefix_cache_mib: float = typer.Option(1024.0, help="radix prefix-cache budget (the baseline)"),
    batch_size: int = typer.Option(20, help="requests per arriving batch (reranked within a batch)"),
    max_delay: int = typer.Option(16, help="reranking: most places a request may slip"),
    micro_batch: int = typer.Option(1, help="requests per micro-batch of the load/compute pipeline"),
    rounds: int = typer.Option(2, help="times the workload is served, fresh state each; the best round is kept"),
    guard_questions: int = typer.Option(8, help="questions of the accuracy guard (0: skip it)"),
    guard_tokens: int = typer.Option(32, help="greedy tokens compared by the accuracy guard"),
    out: Path = typer.Option(Path("bench-out/tables")),
):
    """TTFT of cold, prefix caching, table cache (pfk, independent) and its ablations (TableCache Tables 1/2/4)."""
    from bench.tables import run_tables_bench
    from bench.tables_workload import DATASETS

    if dataset not in DATASETS:
        _fail(f"unknown --dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    run_tables_bench(dataset=dataset, questions=questions, seed=seed, model=model, dtype=dtype, device=device,
                     threads=threads, store=store, device_tier_bytes=int(device_tier_mib * 2**20),
                     prefix_cache_bytes=int(prefix_cache_mib * 2**20), batch_size=batch_size, max_delay=max_delay,
                     micro_batch=micro_batch, rounds=rounds,
                     guard_questions=guard_questions, guard_tokens=guard_tokens, out=out)


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
