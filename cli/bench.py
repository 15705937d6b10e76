"""`headstart bench ...`: the benchmarks of `bench/` (each prints a table, writes JSON and a plot)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bench.neighbour_cli import bench_neighbour
from cli.common import FAST_PATH_CASES, MODEL_HELP, TABLE_CACHE_HELP, check_table_cache, fail, split_values
from headstart.config import MAX_ANSWER_TOKENS
from headstart.models.catalogue import DEFAULT_MODEL

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (they print a table, write JSON and a plot).")


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
                                  "off | auto | onednn | native | inductor"),
    candidates: int = typer.Option(1, help="answers decoded per question (greedy + sampled): the time to the "
                                   "execution-checked answer is measured beside the greedy one's"),
    candidates_wait_all: bool = typer.Option(False, "--candidates-wait-all",
                                             help="the checked answer waits for all candidates (else: those "
                                             "ready when the greedy answer ends)"),
):
    """TTFT of cold, prefix, session(paper) and session(headstart), side by side (APITS Table III)."""
    from bench.ttft import run_ttft_bench
    from headstart.peer.gguf_convert import PeerUnavailable

    check_table_cache(table_cache)
    try:
        run_ttft_bench(model=model, dbs=split_values(db), questions=questions, wpm=wpm, typo_rate=typo_rate,
                       pause=pause, seed=seed, dtype=dtype, device=device, threads=threads,
                       max_new_tokens=max_new_tokens, out=out, table_cache=table_cache, llamacpp=llamacpp,
                       fast_path=fast_path, llamacpp_server=llamacpp_server, candidates=candidates,
                       candidates_wait_all=candidates_wait_all)
    except (PeerUnavailable, ValueError) as exc:  # --llamacpp on without the extra, or a bad choice
        fail(str(exc))


@bench_app.command("decode-step")
def bench_decode_step(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: list[str] = typer.Option(["float32", "bfloat16"], help="dtypes (repeat the option or list them)"),
    kernels: list[str] = typer.Option(["off", "onednn", "inductor"],
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
        run_decode_step_bench(model, split_values(dtype), split_values(kernels), rows, steps, prompt_tokens, threads, out)
    except ValueError as exc:
        fail(str(exc))


@bench_app.command("batch-invariance")
def bench_batch_invariance(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    dtype: list[str] = typer.Option(["float32", "bfloat16"], help="dtypes (repeat the option or list them)"),
    kernels: list[str] = typer.Option(["off", "onednn"], help="fast paths (off, onednn, native, inductor)"),
    rows: int = typer.Option(4, help="rows of the batched forward (caches of different lengths)"),
    new_tokens: int = typer.Option(3, help="most new tokens per row"),
    repeats: int = typer.Option(5, help="batched forwards timed per case (min reported)"),
    threads: Optional[int] = typer.Option(2),
    out: Path = typer.Option(Path("bench-out/batch-invariance")),
):
    """Largest |batched row - lone forward| logit, HEADSTART_BATCH_INVARIANT off and on, and its cost."""
    from bench.batch_invariance import run_batch_invariance_bench

    try:
        run_batch_invariance_bench(model, split_values(dtype), split_values(kernels), rows, new_tokens, repeats, threads, out)
    except ValueError as exc:
        fail(str(exc))


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
    candidates: int = typer.Option(1, min=1, max=16, help="K > 1: our typists ask for the execution-checked answer "
                                   "(decoded during their pauses); rows add the time to it (checked_* fields)"),
    candidates_wait_all: bool = typer.Option(False, "--candidates-wait-all",
                                             help="the checked answer waits for all K candidates (else: those "
                                             "ready when the greedy answer ends)"),
):
    """N concurrent typists (WebSocket and gRPC) against the local stack, vs the prefix baseline."""
    from bench.serve import run_serve_bench
    from headstart.peer.gguf_convert import PeerUnavailable

    try:
        run_serve_bench(out, model=model, dtype=dtype, device=device, replicas=replicas,
                        concurrency=tuple(concurrency), rounds=rounds, wpm=wpm, pause_s=pause,
                        max_new_tokens=max_new_tokens, db=db, seed=seed, say=typer.echo, llamacpp=llamacpp,
                        llamacpp_server=llamacpp_server, candidates=candidates,
                        candidates_wait_all=candidates_wait_all)
    except (PeerUnavailable, ValueError) as exc:  # --llamacpp on without a llama.cpp server, or a bad choice
        fail(str(exc))


# issue 16: the noisy-neighbour benchmark; its command lives beside its code
bench_app.command("neighbour")(bench_neighbour)


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
        run_ready_exit_bench(out, model, split_values(db), batches, max_rows, spider, max_new_tokens, threads, seed)
    except ValueError as exc:  # a database without stream questions
        fail(str(exc))


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
        fail(str(exc))


@bench_app.command("candidate-rows")
def bench_candidate_rows(
    model: str = typer.Option(DEFAULT_MODEL, help=MODEL_HELP),
    k: list[int] = typer.Option([1, 2, 4, 8], help="candidate rows per decode step (repeat the option)"),
    rounds: int = typer.Option(7, help="rounds (levels and K alternating); the median is reported"),
    steps: int = typer.Option(3, help="decode steps timed per round and case"),
    threads: Optional[int] = typer.Option(1),
    out: Path = typer.Option(Path("bench-out/candidate-rows")),
):
    """One decode step of K candidate rows from a shared Spider prompt, per kernel level: ms per step and per row."""
    from bench.candidate_rows import run_candidate_rows_bench

    try:
        run_candidate_rows_bench(model, out, threads, rounds, steps, tuple(k))
    except ValueError as exc:
        fail(str(exc))


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
        fail(f"unknown --dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    run_tables_bench(dataset=dataset, questions=questions, seed=seed, model=model, dtype=dtype, device=device,
                     threads=threads, store=store, device_tier_bytes=int(device_tier_mib * 2**20),
                     prefix_cache_bytes=int(prefix_cache_mib * 2**20), batch_size=batch_size, max_delay=max_delay,
                     micro_batch=micro_batch, rounds=rounds,
                     guard_questions=guard_questions, guard_tokens=guard_tokens, out=out)


@bench_app.command("durability")
def bench_durability(
    pushers: str = typer.Option("1,4", help="concurrent pushers (each its own session), comma-separated"),
    rounds: int = typer.Option(6, help="rounds per policy, alternating which goes first"),
    pushes: int = typer.Option(200, help="pushes per pusher per round"),
    rows: int = typer.Option(8, help="rows per push"),
    dir: Optional[Path] = typer.Option(None, help="where the append-only files live (default: the temp folder)"),
    out: Path = typer.Option(Path("bench-out/durability")),
):
    """A push's store step with appendfsync everysec vs always (what a durable ack costs), side by side."""
    from bench.durability import run_durability_bench

    try:
        run_durability_bench(out, [int(p) for p in pushers.split(",")], rounds, pushes, rows, dir)
    except ValueError as exc:
        fail(str(exc))
