"""bench stream: the paper's streaming scenario (papers/stateful.md), four ways side by side.

A seeded synthetic `prices` table (rows of ~16 tokens: `prices(57, 'NVDA', 187.25)`)
streams into one data session: `--rows-start` rows, then `--iterations` times
`--rows-per-iteration` new rows followed by one query (the same question each
time). Each iteration measures the query four ways, in an order that rotates
per iteration so no mode always runs first (a warm cache, a busy neighbour):

- **reprefill**: a request-driven engine without a cache hit: a cold prefill of
  frozen + all rows + question, then greedy decode.
- **prefix**: prefix caching: the previous iteration's context cache (frozen +
  the rows it had) is reused; the new rows and the question are prefilled at
  query time in one forward, decoded, then cropped back to the context (the
  next iteration's prefix).
- **stateful**: the `DataSession`: the rows were pushed and ingested in the
  background before the query (that ingestion is reported, not counted); the
  query runs only its own tokens on the live cache.
- **flash**: the question is registered; after each data version it was
  evaluated (`DataSession.evaluate`, FLASH priority, in place on the live cache),
  its SQL executed on the working copy at that version, and the answer stored
  with `LiveStore.store_answer` in a real Redis (started with `local_redis()`
  unless `--redis-url`). The query is `LiveStore.lookup` of the stored answer
  for (session, question, current version).

Also: whether the stateful tokens equal the re-prefill tokens every iteration
(`outputs_identical`), the session's dropped rows, and `shift_drift`: a
session with `shift` retention and a small bound (`--shift-bound` tokens) over
the same rows, its first answer token's max |logit diff| against a cold prefill
of what it retained, and whether the greedy answers match.

CPU default (2 cores): 20 + 15 x 11 rows, ~3k tokens of rows, random:qwen2.5-coder-0.5b
float32. The paper's scale (~15k tokens, for a GPU):

    headstart bench stream --rows-start 100 --rows-per-iteration 55 --device cuda

    python -m bench.stream --out bench-out/stream   (or: headstart bench stream)

Writes stream.json, stream.md and stream.png under --out.
"""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
import argparse
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from bench.common import percentile, write_json
from bench.stream_flash import evaluate_one
from headstart.data import DataSession, DataSettings
from headstart.data.live_store import LiveStore
from headstart.engine.kv.state import KVState
from headstart.engine.runtime import EngineRuntime

MODES = ("reprefill", "prefix", "stateful", "flash")
QUESTION = "What is the latest price of each symbol?"
SYMBOLS = ("AAPL", "MSFT", "NVDA", "AMZN", "GOOG", "META", "TSLA", "AMD")


def make_db(directory: Path) -> str:
    path = directory / "prices.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE prices (id INTEGER PRIMARY KEY, symbol TEXT NOT NULL, price REAL)")
    conn.commit()
    conn.close()
    return str(path)


def synthetic_rows(n: int, start: int, seed: int) -> list[dict]:
    """`n` seeded price ticks with ids start+1.. (16-19 tokens a line: the tokenizer splits digits)."""
    rng = random.Random(seed * 100_003 + start)
    return [{"table": "prices", "values": {"id": start + i + 1, "symbol": rng.choice(SYMBOLS),
                                          "price": round(rng.uniform(20, 500), 2)}} for i in range(n)]


def greedy(runtime, kv: KVState, max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decode from `kv`'s last logits, as a data session's query does: at
    most `max_new_tokens` tokens, no forward after the last one."""
    first, tokens = kv.last_logits.clone(), []
    while True:
        token = int(torch.argmax(kv.last_logits))
        if token in runtime.stop_ids:
            break
        tokens.append(token)
        if len(tokens) >= max_new_tokens:
            break
        runtime.runner.extend(kv, [token])
    return tokens, first


def timed(runtime, fn):
    """(result, ms) of `fn` run on the forward worker, timed from the caller like a query is."""
    started = time.perf_counter()
    result = runtime.worker.run_sync(fn)
    return result, (time.perf_counter() - started) * 1000


class Reprefill:
    """A cold prefill of the whole prompt per query."""

    def query(self, runtime, context: list[int], question: list[int], new_tokens: int):
        return timed(runtime, lambda: greedy(runtime, runtime.runner.prefill(context + question), new_tokens)[0])


class Prefix:
    """Prefix caching: the cached context grows by the rows it has not seen, at query time."""

    def __init__(self):
        self.kv, self.previous = KVState(), 0

    def query(self, runtime, context: list[int], question: list[int], new_tokens: int, again: bool = False):
        """`again`: a repeat of the last query, from the same previous context."""
        def run():
            kv = self.kv
            if again:
                kv.crop(self.previous)
            else:
                self.previous = kv.num_tokens
            assert kv.ids == context[:kv.num_tokens], "the prefix cache must be a prefix of the context"
            runtime.runner.extend(kv, context[kv.num_tokens:] + question)  # one suffix forward, as an engine would
            tokens = greedy(runtime, kv, new_tokens)[0]
            kv.crop(len(context))  # keep the context for the next query's prefix hit
            return tokens

        return timed(runtime, run)


def run_stream_bench(out: Path, model: str = DEFAULT_MODEL, dtype: str = "float32",
                     device: str = "cpu", threads: int | None = 2, rows_start: int = 20,
                     rows_per_iteration: int = 11, iterations: int = 15, new_tokens: int = 8,
                     shift_bound: int = 256, seed: int = 0, redis_url: str | None = None, repeats: int = 1) -> dict:
    """Run the scenario, write stream.json / stream.md / stream.png under `out`, return the report."""
    from bench.stream_report import markdown, plot

    if iterations < 1 or rows_per_iteration < 1 or rows_start < 0 or repeats < 1:
        raise ValueError("need iterations >= 1, rows_per_iteration >= 1, rows_start >= 0, repeats >= 1")
    runtime = EngineRuntime.from_settings(model=model, dtype=dtype, device=device, threads=threads,
                                          p0_cache_on_disk=False, chunk_tokens=256, max_prompt_tokens=32768)
    try:
        with tempfile.TemporaryDirectory(prefix="headstart-bench-stream-") as tmp, ExitStack() as stack:
            db = make_db(Path(tmp))
            url = redis_url or stack.enter_context(_local_redis()).url
            loop = stream_loop(runtime, db, url, rows_start, rows_per_iteration, iterations, new_tokens, seed,
                               repeats)
            print(f"shift retention, bound {shift_bound} tokens", flush=True)
            drift = shift_drift(runtime, db, rows_start, rows_per_iteration, iterations, new_tokens, shift_bound,
                                seed)
    finally:
        runtime.shutdown()
    points = loop["iterations"]
    modes = {}
    for mode in MODES:
        ms = [p[f"{mode}_ms"] for p in points]
        modes[mode] = dict(p50_ms=percentile(ms, 50), p99_ms=percentile(ms, 99), first_ms=ms[0], last_ms=ms[-1],
                           growth=ms[-1] / ms[0] if ms[0] > 0 else float("nan"))
    last = points[-1]
    report = dict(model=model, dtype=dtype, device=device, threads=threads, rows_start=rows_start,
                  rows_per_iteration=rows_per_iteration, iterations=iterations, new_tokens=new_tokens, seed=seed,
                  repeats=repeats,
                  question=QUESTION, question_tokens=loop["question_tokens"], frozen_tokens=loop["frozen_tokens"],
                  flash_source=loop["flash_source"], modes=modes,
                  outputs_identical=all(p["stateful_match"] for p in points),
                  prefix_identical=all(p["prefix_match"] for p in points),
                  flash_identical=all(p["flash_match"] for p in points),
                  rows_dropped=loop["rows_dropped"], shift_drift=drift,
                  last_speedup=dict(stateful_vs_reprefill=last["reprefill_ms"] / last["stateful_ms"],
                                    flash_vs_stateful=last["stateful_ms"] / max(last["flash_ms"], 1e-9)),
                  iterations_detail=points)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "stream.json", report)
    text = markdown(report)
    (out / "stream.md").write_text(text)
    plot(report, out / "stream.png")
    print(text)
    return report


@contextmanager
def _local_redis():
    from headstart.redis_server import local_redis

    with local_redis() as server:
        yield server


def stream_loop(runtime, db: str, redis_url: str, rows_start: int, per_iteration: int, iterations: int,
                new_tokens: int, seed: int, repeats: int = 1) -> dict:
    """The measured run: per iteration, rows in, then the question four ways."""
    session = DataSession(runtime, db, DataSettings(retention_tokens=1 << 24, max_row_tokens=64))
    store = LiveStore(redis_url, prefix=f"hs-bench-{uuid.uuid4().hex[:8]}")
    question = session.prompt.question_ids(QUESTION)
    reprefill, prefix = Reprefill(), Prefix()
    qid = store.register_flash(session.id, QUESTION)
    points = []
    try:
        pushed = rows_start
        if rows_start:
            session.push(synthetic_rows(rows_start, 0, seed))
        session.wait_idle(3600)
        # warm-up, not recorded: first-call costs (allocator, kernels) are not the context's; it also
        # fills the prefix cache with the starting context, as the previous query would have
        context = session.context_ids()
        reprefill.query(runtime, context, question, new_tokens)
        prefix.query(runtime, context, question, new_tokens)
        session.query(QUESTION, new_tokens)
        store.lookup(session.id, QUESTION, session.data_version)  # opens the client's connection
        for it in range(1, iterations + 1):
            started = time.perf_counter()
            session.push(synthetic_rows(per_iteration, pushed, seed))
            session.wait_idle(3600)  # background ingestion done: the data arrived before the question
            ingest_ms = (time.perf_counter() - started) * 1000
            pushed += per_iteration
            version = session.data_version
            started = time.perf_counter()
            answer = evaluate_one(session, QUESTION, new_tokens)
            store.store_answer(session.id, qid, answer, publish=True)  # as the flash worker does
            flash_eval_ms = (time.perf_counter() - started) * 1000
            context = session.context_ids()
            got: dict = {}
            order = MODES[it % len(MODES):] + MODES[:it % len(MODES)]  # rotate: none always first
            for mode in order:
                runs = []
                for again in range(repeats):
                    if mode == "reprefill":
                        runs.append(reprefill.query(runtime, context, question, new_tokens))
                    elif mode == "prefix":
                        runs.append(prefix.query(runtime, context, question, new_tokens, again=again > 0))
                    elif mode == "stateful":
                        result = session.query(QUESTION, new_tokens)
                        runs.append((result.token_ids, result.seconds * 1000))
                    else:
                        t0 = time.perf_counter()
                        hit = store.lookup(session.id, QUESTION, session.data_version)
                        runs.append((hit, (time.perf_counter() - t0) * 1000))
                got[mode] = (runs[0][0], statistics.median(ms for _, ms in runs))
            hit = got["flash"][0]
            if hit is None or hit.get("version") != version:
                raise RuntimeError(f"iteration {it}: no flash answer for version {version} ({hit!r})")
            point = dict(iteration=it, rows=session.describe()["rows_in_cache"],
                         context_tokens=len(context), data_version=version, ingest_ms=ingest_ms,
                         flash_eval_ms=flash_eval_ms, **{f"{m}_ms": got[m][1] for m in MODES},
                         stateful_match=got["stateful"][0] == got["reprefill"][0],
                         prefix_match=got["prefix"][0] == got["reprefill"][0],
                         flash_match=hit["text"] == session.prompt.decode(got["stateful"][0]))
            points.append(point)
            print(f"  iteration {it:2d}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                     for k, v in point.items() if k != "iteration"), flush=True)
        rows_dropped = session.describe()["dropped"]
        frozen = session.frozen_tokens
    finally:
        session.close()
        store.delete_session(session.id)
        store.close()
    return dict(iterations=points, rows_dropped=rows_dropped, question_tokens=len(question), frozen_tokens=frozen,
                flash_source="DataSession.evaluate")


def shift_drift(runtime, db: str, rows_start: int, per_iteration: int, iterations: int, new_tokens: int, bound: int,
                seed: int) -> dict:
    """The same rows through a `shift` session bounded at `bound` tokens, a batch per
    iteration as above; then its answer against a cold prefill of what it kept."""
    session = DataSession(runtime, db, DataSettings(retention="shift", retention_tokens=bound,
                                                    max_row_tokens=min(64, bound)))
    try:
        batches = [(0, rows_start)] if rows_start else []
        batches += [(rows_start + i * per_iteration, per_iteration) for i in range(iterations)]
        for start, n in batches:
            session.push(synthetic_rows(n, start, seed))
            session.wait_idle(3600)
        result = session.query(QUESTION, new_tokens)
        context = session.context_ids() + session.prompt.question_ids(QUESTION)
        cold_tokens, first = runtime.worker.run_sync(lambda: greedy(runtime, runtime.runner.prefill(context),
                                                                    new_tokens))
        info = session.describe()
    finally:
        session.close()
    diff = float((result.first_logits.double() - first.double()).abs().max())
    return dict(bound_tokens=bound, max_logit_diff=diff, greedy_match=result.token_ids == cold_tokens,
                shifts=info["shifts"], rows_in_cache=info["rows_in_cache"], sliding_tokens=info["sliding_tokens"],
                retired=info["retired"], retention_ms=info["retention_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out/stream"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows-start", type=int, default=20, help="rows before the first iteration (paper: 100)")
    parser.add_argument("--rows-per-iteration", type=int, default=11, help="new rows before each query (paper: 55)")
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--new-tokens", type=int, default=8, help="answer tokens per query")
    parser.add_argument("--shift-bound", type=int, default=256, help="retention bound (tokens) of the shift session")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redis-url", default=None, help="a Redis for the flash answers (default: start one)")
    parser.add_argument("--repeats", type=int, default=1, help="queries per mode per iteration (median; noisy hosts)")
    a = parser.parse_args()
    run_stream_bench(a.out, a.model, a.dtype, a.device, a.threads, a.rows_start, a.rows_per_iteration, a.iterations,
                     a.new_tokens, a.shift_bound, a.seed, a.redis_url, a.repeats)


if __name__ == "__main__":
    main()
