"""bench data: data sessions' query latency against rows in the cache, and
retention's two modes (shift vs rebuild) on drift and cost.

1. **Latency vs rows.** One session (no retention within the run) ingests a
   seeded synthetic `readings` table in steps; after each step the same
   question is asked `--repeats` times on the live cache (the stateful path)
   and as a cold prefill of the same prompt (what a request-driven engine
   without a cache hit does). The stateful query runs only its own tokens
   plus attention over the cache, so it should stay nearly flat.
2. **shift vs rebuild.** Two sessions with the same bound ingest the same
   rows in batches, well past the bound; then both answer the same
   questions. Drift: max |logit diff| of the first answer token against a
   cold prefill of (frozen + retained rows + question), and whether the
   greedy answer matches. Cost: worker time spent in retention (shift's
   re-rotation; rebuild's re-prefill forwards) per retention pass, and the
   ingestion wall time; `none` is the same rows with a bound never reached
   (its cache keeps growing: a reference for drift and query time only).
   Accuracy: eight questions with gold SQL (`GOLD`) answered in full on each
   mode's cache (the flash path), their SQL run at the answer's version:
   how many are right, and how many whole answers equal a cold prefill's.
3. **Ready-position exit** (paper §3.9.4). One session keeps its
   ready-position logits; after each batch every question is answered in
   full, and the gap rule alone is scored offline at each threshold: hit
   rate (the gap is above it) and errors (a hit whose one token is not the
   full answer's first token, or not its whole text). The exit itself also
   needs a fast answer (`headstart.data.ready`); on a trained model and
   Spider databases: `headstart bench ready-exit`.

    headstart bench data --out bench-out/data

Writes data.json, data.md and data.png under --out.
"""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import markdown_table, write_json
from headstart.data import DataSession, DataSettings
from headstart.engine.runtime import EngineRuntime

QUESTIONS = ["What is the average value per sensor?", "Which sensor had the highest reading?",
             "How many readings are above 50?"]
# Retention's accuracy: questions with the SQL that answers them (run on the working copy at the
# answer's data version, as the flash answers' SQL is). The model sees only the rows retention kept;
# the SQL runs on every row, so a right answer is the SQL, not the numbers it has seen.
GOLD = [("How many readings are there?", "SELECT count(*) FROM readings"),
        ("What is the average value per sensor?", "SELECT sensor, avg(value) FROM readings GROUP BY sensor"),
        ("Which sensor had the highest reading?", "SELECT sensor FROM readings ORDER BY value DESC LIMIT 1"),
        ("How many readings are above 50?", "SELECT count(*) FROM readings WHERE value > 50"),
        ("How many readings came from the north site?", "SELECT count(*) FROM readings WHERE site = 'north'"),
        ("What is the lowest value recorded?", "SELECT min(value) FROM readings"),
        ("Which sites have readings?", "SELECT DISTINCT site FROM readings"),
        ("What is the average value at each site?", "SELECT site, avg(value) FROM readings GROUP BY site")]


def make_db(directory: Path) -> str:
    path = directory / "readings.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE readings (id INTEGER PRIMARY KEY, sensor TEXT NOT NULL, site TEXT, "
                 "value REAL, ts TEXT)")
    conn.commit()
    conn.close()
    return str(path)


def synthetic_rows(n: int, start: int, seed: int) -> list[dict]:
    """Seeded readings, ~40 tokens a line (random:tiny's tokenizer splits digits)."""
    rng = random.Random(seed * 100_003 + start)
    return [{"table": "readings", "values": {
        "id": start + i, "sensor": f"sensor-{rng.randrange(12)}", "site": rng.choice(["north", "south", "east"]),
        "value": round(rng.uniform(0, 100), 2), "ts": f"2026-11-24T07:{(start + i) // 60 % 60:02d}:{(start + i) % 60:02d}",
    }} for i in range(n)]


def cold(runtime, ids: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor, float]:
    started = time.perf_counter()
    kv = runtime.runner.prefill(ids)
    first, tokens = kv.last_logits.clone(), []
    for _ in range(max_new_tokens):
        token = int(torch.argmax(kv.last_logits))
        if token in runtime.stop_ids:
            break
        tokens.append(token)
        runtime.runner.extend(kv, [token])
    return tokens, first, time.perf_counter() - started


def latency_vs_rows(runtime, db: str, steps: list[int], repeats: int, new_tokens: int, seed: int) -> list[dict]:
    session = DataSession(runtime, db, DataSettings(retention_tokens=1 << 20, max_row_tokens=64, batch_rows=64,
                                                    buffer_rows=1 << 16))
    points, pushed = [], 0
    try:
        session.query(QUESTIONS[0], new_tokens)  # warm-up: first-call costs are not the cache's
        runtime.worker.run_sync(lambda: cold(runtime, session.context_ids() + session.prompt.question_ids(
            QUESTIONS[0]), new_tokens))
        for target in steps:
            if target > pushed:
                for at in range(pushed, target, 256):
                    session.push(synthetic_rows(min(256, target - at), at, seed))
                session.wait_idle(600)
                pushed = target
            question = QUESTIONS[0]
            stateful, reprefill = [], []
            for _ in range(repeats):
                stateful.append(session.query(question, new_tokens).seconds * 1000)
                ids = session.context_ids() + session.prompt.question_ids(question)
                reprefill.append(runtime.worker.run_sync(lambda: cold(runtime, ids, new_tokens)[2]) * 1000)
            points.append(dict(rows=target, context_tokens=len(session.context_ids()),
                               stateful_ms=statistics.median(stateful), stateful_min_ms=min(stateful),
                               reprefill_ms=statistics.median(reprefill), reprefill_min_ms=min(reprefill)))
            print(f"  rows {target:5d}: {points[-1]}", flush=True)
    finally:
        session.close()
    return points


def retention_accuracy(runtime, session: DataSession, answer_tokens: int) -> dict:
    """GOLD's questions answered in full on the session's cache (its flash path): how many answers'
    SQL gives the gold SQL's result (`spider` rules), and how many answers equal, token for token,
    a cold prefill's of the same context (what `rebuild` promises; `shift` changes attention)."""
    from headstart.eval.compare import get_rule
    from headstart.eval.records import ResultSet

    rule, right, same, wrong = get_rule("spider"), 0, 0, []
    answers = session.evaluate([q for q, _ in GOLD], max_new_tokens=answer_tokens)
    for (question, gold_sql), answer in zip(GOLD, answers):
        names, rows = session.copy.execute(gold_sql, answer.version)
        ok = answer.error is None and rule.equal(ResultSet(tuple(names), tuple(rows)),
                                                 ResultSet(tuple(answer.columns), tuple(answer.rows)), gold_sql)
        right += ok
        if not ok:
            wrong.append(dict(question=question, sql=answer.sql, error=answer.error))
        ids = session.context_ids() + session.prompt.question_ids(question)
        tokens, _, _ = runtime.worker.run_sync(lambda: cold(runtime, ids, answer_tokens))
        same += answer.token_ids == tokens
    return dict(accuracy_right=right, accuracy_questions=len(GOLD), same_as_cold=same, wrong=wrong)


def retention_modes(runtime, db: str, rows: int, batch: int, bound: int, new_tokens: int, seed: int,
                    answer_tokens: int = 96) -> dict:
    out = {}
    for mode in ("none", "shift", "rebuild"):
        settings = DataSettings(retention_tokens=(1 << 20) if mode == "none" else bound,
                                retention="shift" if mode == "none" else mode, max_row_tokens=64, batch_rows=batch,
                                buffer_rows=1 << 16)
        session = DataSession(runtime, db, settings)
        try:
            started = time.perf_counter()
            for at in range(0, rows, batch):
                session.push(synthetic_rows(min(batch, rows - at), at, seed))
                session.wait_idle(600)  # one batch at a time: every batch passes the bound
            ingest_s = time.perf_counter() - started
            info = session.describe()
            drifts, matches, qms = [], [], []
            for question in QUESTIONS:
                result = session.query(question, new_tokens)
                ids = session.context_ids() + session.prompt.question_ids(question)
                tokens, first, _ = runtime.worker.run_sync(lambda: cold(runtime, ids, new_tokens))
                drifts.append(float((result.first_logits.double() - first.double()).abs().max()))
                matches.append(result.token_ids == tokens)
                qms.append(result.seconds * 1000)
            accuracy = retention_accuracy(runtime, session, answer_tokens)
            out[mode] = dict(**accuracy,ingest_ms=ingest_s * 1000, ingest_ms_per_batch=ingest_s * 1000 / -(-rows // batch),
                             max_logit_diff=max(drifts), greedy_match=sum(matches), questions=len(QUESTIONS),
                             query_ms=statistics.median(qms), rows_in_cache=info["rows_in_cache"],
                             sliding_tokens=info["sliding_tokens"], retired=info["retired"],
                             retention_ms=info["retention_ms"], rebuild_tokens=info["rebuild_tokens"],
                             retention_ms_per_pass=info["retention_ms"] / max(1, info["shifts"] + info["rebuilds"]),
                             shifts=info["shifts"], rebuilds=info["rebuilds"])
            print(f"  {mode:8s}: {out[mode]}", flush=True)
        finally:
            session.close()
    return out


def ready_exit(runtime, db: str, rows: int, batch: int, thresholds: list[float], new_tokens: int,
               seed: int) -> dict:
    """Hit rate and errors of the speculative exit by threshold (module doc, 3)."""
    session = DataSession(runtime, db, DataSettings(retention_tokens=1 << 20, max_row_tokens=64, batch_rows=batch,
                                                    buffer_rows=1 << 16, ready_exit_gap=float("inf")))
    samples = []
    try:
        for at in range(0, rows, batch):
            session.push(synthetic_rows(min(batch, rows - at), at, seed))
            session.wait_idle(600)
            ready = session.ready_position()
            for question in QUESTIONS:
                full = session.query(question, new_tokens, allow_speculative=False)
                samples.append(dict(gap=ready.gap, stop=ready.token in runtime.stop_ids,
                                    first=bool(full.token_ids) and full.token_ids[0] == ready.token,
                                    whole=full.text == ready.text))
    finally:
        session.close()
    by = {}
    for tau in thresholds:
        hits = [x for x in samples if x["gap"] > tau and not x["stop"]]
        by[str(tau)] = dict(hit_rate=len(hits) / len(samples), hits=len(hits),
                            first_token_errors=sum(not x["first"] for x in hits),
                            text_errors=sum(not x["whole"] for x in hits))
    gaps = sorted(x["gap"] for x in samples)
    return dict(queries=len(samples), gap_p50=gaps[len(gaps) // 2], gap_max=gaps[-1], thresholds=by)


def run_data_bench(out: Path, model: str = DEFAULT_MODEL, dtype: str = "float32", threads: int = 2,
                   steps: list[int] | None = None, repeats: int = 5, new_tokens: int = 8, latency_tokens: int = 1, retention_rows: int = 120,
                   retention_batch: int = 10, bound: int = 600, seed: int = 0, answer_tokens: int = 96,
                   ready_thresholds: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)) -> dict:
    steps = steps or [0, 25, 50, 100, 200]
    runtime = EngineRuntime.from_settings(model=model, dtype=dtype, threads=threads, p0_cache_on_disk=False,
                                          chunk_tokens=256, max_prompt_tokens=32768)
    try:
        with tempfile.TemporaryDirectory(prefix="headstart-bench-data-") as tmp:
            db = make_db(Path(tmp))
            print("query latency vs rows in the cache", flush=True)
            latency = latency_vs_rows(runtime, db, steps, repeats, latency_tokens, seed)
            print(f"retention: {retention_rows} rows in batches of {retention_batch}, bound {bound} tokens", flush=True)
            retention = retention_modes(runtime, db, retention_rows, retention_batch, bound, new_tokens, seed,
                                        answer_tokens)
            print("ready-position exit by threshold", flush=True)
            ready = ready_exit(runtime, db, retention_rows, retention_batch, list(ready_thresholds), new_tokens, seed)
    finally:
        runtime.shutdown()
    first, last = latency[0], latency[-1]
    report = dict(model=model, dtype=dtype, threads=threads, new_tokens=new_tokens, latency_tokens=latency_tokens,
                  answer_tokens=answer_tokens,
                  repeats=repeats,
                  latency=latency, stateful_growth=last["stateful_ms"] / first["stateful_ms"],
                  reprefill_growth=last["reprefill_ms"] / first["reprefill_ms"],
                  retention=dict(rows=retention_rows, batch=retention_batch, bound_tokens=bound, modes=retention),
                  ready_exit=ready)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "data.json", report)
    text = markdown(report)
    (out / "data.md").write_text(text)
    plot(report, out / "data.png")
    print(text)
    return report


def markdown(report: dict) -> str:
    lat = [[p["rows"], p["context_tokens"], f"{p['stateful_ms']:.1f}", f"{p['reprefill_ms']:.1f}",
            f"{p['reprefill_ms'] / p['stateful_ms']:.1f}x"] for p in report["latency"]]
    modes = report["retention"]["modes"]
    ret = [[m, f"{v['ingest_ms_per_batch']:.1f}", f"{v['shifts'] + v['rebuilds']}", f"{v['retention_ms_per_pass']:.1f}",
            f"{v['max_logit_diff']:.2e}",
            f"{v['greedy_match']}/{v['questions']}", f"{v['query_ms']:.1f}", v["rows_in_cache"], v["retired"],
            f"{v['accuracy_right']}/{v['accuracy_questions']}", f"{v['same_as_cold']}/{v['accuracy_questions']}"]
           for m, v in modes.items()]
    r, ready = report["retention"], report["ready_exit"]
    exits = [[tau, f"{v['hit_rate']:.0%}", v["hits"], v["first_token_errors"], v["text_errors"]]
             for tau, v in ready["thresholds"].items()]
    return (f"bench data: {report['model']} {report['dtype']}, {report['threads']} threads, "
            f"median of {report['repeats']}\n\nquery latency vs rows ({report['latency_tokens']} answer token(s))\n\n"
            + markdown_table(["rows", "context tokens", "stateful ms", "re-prefill ms", "speed-up"], lat)
            + f"\n\ngrowth last/first: stateful {report['stateful_growth']:.2f}, "
              f"re-prefill {report['reprefill_growth']:.2f}\n\n"
            + f"retention: {r['rows']} rows in batches of {r['batch']}, bound {r['bound_tokens']} tokens "
              f"(none: bound never reached), {report['new_tokens']} answer tokens; {len(GOLD)} questions "
              f"answered in full (cap {report['answer_tokens']}) for EX and for equality with cold\n\n"
            + markdown_table(["mode", "ingest ms/batch", "retention passes", "ms per pass", "max abs logit diff vs cold", "greedy match", "query ms",
                              "rows kept", "rows retired", "SQL right (EX)", "whole answer = cold"], ret)
            + f"\n\nready-position exit: {ready['queries']} queries, logit gap p50 {ready['gap_p50']:.2f}, "
              f"max {ready['gap_max']:.2f} (an error: a hit whose token is not the full answer's "
              "first token / text)\n\n"
            + markdown_table(["threshold", "hit rate", "hits", "first-token errors", "text errors"], exits) + "\n")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    lat = report["latency"]
    xs = [p["context_tokens"] for p in lat]
    axes[0].plot(xs, [p["stateful_ms"] for p in lat], "o-", label="stateful (live cache)")
    axes[0].plot(xs, [p["reprefill_ms"] for p in lat], "s-", label="re-prefill (cold)")
    axes[0].set_xlabel("context tokens (frozen + rows)")
    axes[0].set_ylabel("query ms (median)")
    axes[0].legend()
    modes = report["retention"]["modes"]
    names = list(modes)
    names = [m for m in names if m != "none"]
    axes[1].bar(names, [modes[m]["retention_ms_per_pass"] for m in names], color=["tab:orange", "tab:green"])
    for i, m in enumerate(names):
        axes[1].annotate(f"diff {modes[m]['max_logit_diff']:.1e}\nmatch {modes[m]['greedy_match']}/"
                         f"{modes[m]['questions']}", (i, modes[m]["retention_ms_per_pass"]), ha="center", va="bottom",
                         fontsize=8)
    axes[1].set_ylabel("worker ms per retention pass")
    axes[1].set_ylim(0, 1.35 * max([modes[m]["retention_ms_per_pass"] for m in names] + [1e-3]))  # room for labels
    axes[1].set_title("retention: shift vs rebuild")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
