"""bench ready-exit: the stateful paper's ready-position speculative exit
(papers/stateful.md §3.9.4) on a trained model, over Spider databases.

Each database's rows stream into one data session, starting from an empty
copy of the database (its own rows, in table and rowid order, split into
`--batches` ingestion batches; rows the session refuses are left out and
counted). After each batch the session keeps its ready-position logits (the
model's next token after the prompt's question-less tail, on that version),
and every question of that checkpoint is answered in full (greedy, to EOS or
`--max-new-tokens`) with the exit bypassed: `--spider` Spider dev questions
of the database (different ones at each checkpoint) and three a data-session
user would register on a stream (a count, two yes/no questions).

The exit is then scored offline, per threshold tau: it *fires* when the ready
gap (top-1 minus top-2 logit) is above tau and the top token is not a stop
token (the rule `headstart.data.ready` implements); `fires in V` adds the
paper's condition that the token is in the fast-answer vocabulary (stripped,
case-folded text in `headstart.data.ready.FAST_ANSWERS`).

"Right": the exit's one-token text T against the full answer (text F, its
extracted SQL S, and S's result on the working copy at that version), right
when any of these holds: T == F (the model would have said only T); T.strip()
== S (the same SQL); S's result is one cell and T names it (the same number
or text, case-folded; yes/true for a non-zero number or a 'yes'/'true' text,
no/false for zero or 'no'/'false'). Also reported: whether T is the full
answer's first token (the exit returns a prefix of the answer, not an answer).

    python -m bench.ready_exit --out bench-out/ready-exit   (or: headstart bench ready-exit)

Writes ready-exit.json, ready-exit.md and ready-exit.png under --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import sqlite3
import statistics
import tempfile
from pathlib import Path

from bench.common import markdown_table, write_json
from headstart.data import DataSession, DataSettings
from headstart.data.ingest import validate_rows
from headstart.data.ready import in_fast_vocabulary
from headstart.data.rows import affinity
from headstart.engine.errors import InvalidInput
from headstart.engine.runtime import EngineRuntime
from headstart.models.catalogue import DEFAULT_MODEL
from headstart.paths import default_spider_dir

THRESHOLDS = (0.5, 1.0, 2.0, 4.0, 8.0)
# a stream user's questions per database: (table, a numeric column, a threshold);
# small Spider databases, so the whole database streams in a few batches
STREAMS = {
    "concert_singer": ("stadium", "Capacity", 5000),
    "pets_1": ("Student", "Age", 20),
    "orchestra": ("conductor", "Age", 50),
    "employee_hire_evaluation": ("evaluation", "Bonus", 3000),
}
_YES, _NO = {"yes", "true"}, {"no", "false"}


def stream_questions(table: str, column: str, above: int) -> list[str]:
    return [f"How many rows does the {table} table have?",
            f"Is the {column} of the most recently added {table} row above {above}? Answer yes or no.",
            f"Are there more than 5 rows in {table}? Answer yes or no."]


def empty_copy(source: Path, directory: Path) -> tuple[str, list[dict]]:
    """A copy of `source` with every table emptied, and its rows as pushes (table order, rowid order)."""
    target = directory / source.parent.name / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    conn = sqlite3.connect(target)
    conn.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                             "AND name NOT LIKE 'sqlite_%' ORDER BY rowid")]
        rows = []
        for table in tables:
            cur = conn.execute(f'SELECT * FROM "{table}"')
            names = [d[0] for d in cur.description]
            rows += [{"table": table, "values": {n: v for n, v in zip(names, values) if v is not None}}
                     for values in cur.fetchall()]
            conn.execute(f'DELETE FROM "{table}"')
        conn.commit()
    finally:
        conn.close()
    return str(target), rows


def as_declared(schema, raw: dict) -> dict:
    """`raw` with each value in its column's declared type, as SQLite's affinity
    would keep it (numeric text becomes a number, a number in a text column
    text); a value that fits no such way ('F' in a bool column) is left out
    (NULL). Spider's files break their declared types; the session's rows
    API is strict (`headstart.data.rows`)."""
    table, values = schema.table(raw["table"]), {}
    for name, value in raw["values"].items():
        column = table.column(name)
        kind = affinity(column.type)
        temporal = any(s in column.type.upper() for s in ("DATE", "TIME", "YEAR"))
        if kind == "TEXT" and isinstance(value, (int, float)):
            value = str(value)
        elif kind in ("INTEGER", "REAL", "NUMERIC") and isinstance(value, str) and not (kind == "NUMERIC" and temporal):
            try:
                value = float(value.strip())
            except ValueError:
                continue
        if kind == "INTEGER" and isinstance(value, float):
            if not value.is_integer():
                continue
            value = int(value)
        values[name] = value
    return {"table": raw["table"], "values": values}


def _cell_says(token: str, cell) -> bool:
    """Whether a one-token answer names a one-cell result (module doc)."""
    if isinstance(cell, (int, float)):
        if token in _YES or token in _NO:
            return (cell != 0) == (token in _YES)
        try:
            return float(token) == float(cell)
        except ValueError:
            return False
    text = str(cell).strip().lower()
    if token in _YES | _NO and text in _YES | _NO:
        return (token in _YES) == (text in _YES)
    return token == text


def score(exit_text: str, exit_token: int, full_text: str, full_sql: str, full_tokens: list[int],
          result: list[tuple] | None) -> dict:
    """Whether the exit's one token would have been right for this full answer (module doc)."""
    token = exit_text.strip()
    text = exit_text == full_text
    sql = bool(token) and token == full_sql.strip()
    cell = result is not None and len(result) == 1 and len(result[0]) == 1 and bool(token) \
        and _cell_says(token.lower(), result[0][0])
    return dict(first=full_tokens[:1] == [exit_token], same_text=text, same_sql=sql, same_result=cell,
                right=text or sql or cell)


def checkpoints(runtime, spider: Path, db: str, tmp: Path, batches: int, max_rows: int, spider_per_batch: int,
                max_new_tokens: int, seed: int) -> tuple[list[dict], int]:
    """Stream `db` in `batches`; per batch, the ready position and the full answers (module doc)."""
    path, rows = empty_copy(spider / "database" / db / f"{db}.sqlite", tmp)
    dev = [q["question"] for q in json.loads((spider / "dev.json").read_text()) if q["db_id"] == db]
    random.Random(seed).shuffle(dev)
    session = DataSession(runtime, path, DataSettings(retention_tokens=1 << 16, max_row_tokens=256, batch_rows=64,
                                                      buffer_rows=1 << 16, ready_exit_gap=float("inf")))
    kept = []
    for row in rows:  # rows the session still refuses (a NOT NULL value of the wrong type) are left out
        row = as_declared(session.prompt.schema, row)
        try:
            validate_rows(session.prompt, session.settings, [row])
            kept.append(row)
        except InvalidInput:
            pass
    kept = kept[:max_rows]
    size = -(-len(kept) // batches)
    points = []
    try:
        for b in range(batches):
            session.push(kept[b * size:(b + 1) * size])
            session.wait_idle(600)
            ready = session.ready_position()
            top2 = ready.logits.topk(2).indices.tolist()
            point = dict(db=db, batch=b, version=ready.version, rows=ready.rows, context=ready.context,
                         token=ready.token, text=ready.text, gap=ready.gap,
                         second=session.prompt.decode([top2[1]]), stop=ready.token in runtime.stop_ids,
                         in_vocabulary=in_fast_vocabulary(ready.text), answers=[])
            asked = [("spider", q) for q in dev[b * spider_per_batch:(b + 1) * spider_per_batch]]
            asked += [("stream", q) for q in stream_questions(*STREAMS[db])]
            for kind, question in asked:
                full = session.query(question, max_new_tokens, allow_speculative=False)
                try:
                    result = session.execute(full.sql, full.data_version)[1] if full.sql else None
                except InvalidInput:
                    result = None
                point["answers"].append(dict(kind=kind, question=question, text=full.text, sql=full.sql,
                                             tokens=len(full.token_ids), ms=full.seconds * 1000,
                                             result=None if result is None else [list(r) for r in result[:3]],
                                             **score(ready.text, ready.token, full.text, full.sql,
                                                     full.token_ids, result)))
            points.append(point)
            print(f"  {db} batch {b}: {ready.rows} rows, ready {ready.text!r} gap {ready.gap:.2f} "
                  f"(2nd {point['second']!r}); first-token agree "
                  f"{sum(a['first'] for a in point['answers'])}/{len(point['answers'])}", flush=True)
    finally:
        session.close()
    return points, len(rows) - len(kept)


def by_threshold(points: list[dict], thresholds) -> list[dict]:
    """Per tau: ready positions clearing it, queries the exit would answer, and how many of those are right."""
    answers = [(p, a) for p in points for a in p["answers"]]
    out = []
    for tau in thresholds:
        clears = [p for p in points if p["gap"] > tau]
        fires = [(p, a) for p, a in answers if p["gap"] > tau and not p["stop"]]
        in_v = [(p, a) for p, a in fires if p["in_vocabulary"]]
        out.append(dict(tau=tau, positions=len(points), clear=len(clears), queries=len(answers), fires=len(fires),
                        right=sum(a["right"] for _, a in fires), first_token=sum(a["first"] for _, a in fires),
                        fires_in_v=len(in_v), right_in_v=sum(a["right"] for _, a in in_v)))
    return out


def run_ready_exit_bench(out: Path, model: str = DEFAULT_MODEL, dbs: list[str] | None = None, batches: int = 3,
                         max_rows: int = 48, spider_per_batch: int = 2, max_new_tokens: int = 64,
                         threads: int = 2, seed: int = 0, spider_dir: Path | None = None,
                         thresholds=THRESHOLDS) -> dict:
    dbs = dbs or list(STREAMS)
    unknown = [db for db in dbs if db not in STREAMS]
    if unknown:
        raise ValueError(f"no stream questions for {unknown}; choose from {sorted(STREAMS)}")
    spider = spider_dir or default_spider_dir()
    runtime = EngineRuntime.from_settings(model=model, threads=threads, p0_cache_on_disk=False, chunk_tokens=256,
                                          max_prompt_tokens=32768, spider_dir=spider)
    points, refused = [], {}
    try:
        with tempfile.TemporaryDirectory(prefix="headstart-bench-ready-") as tmp:
            for db in dbs:
                got, refused[db] = checkpoints(runtime, spider, db, Path(tmp), batches, max_rows, spider_per_batch,
                                               max_new_tokens, seed)
                points += got
    finally:
        runtime.shutdown()
    answers = [a for p in points for a in p["answers"]]
    report = dict(model=model, dbs=dbs, batches=batches, max_rows=max_rows, spider_per_batch=spider_per_batch,
                  max_new_tokens=max_new_tokens, seed=seed, refused_rows=refused,
                  top_tokens=collections.Counter(p["text"] for p in points).most_common(),
                  first_tokens=collections.Counter(a["text"][:12] for a in answers).most_common(5),
                  full_ms_p50=statistics.median(a["ms"] for a in answers),
                  full_tokens_p50=statistics.median(a["tokens"] for a in answers),
                  thresholds=by_threshold(points, thresholds), points=points)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "ready-exit.json", report)
    text = markdown(report)
    (out / "ready-exit.md").write_text(text)
    plot(report, out / "ready-exit.png")
    print(text)
    return report


def markdown(report: dict) -> str:
    points = report["points"]
    pos = [[p["db"], p["rows"], p["context"], repr(p["text"]), f"{p['gap']:.2f}", repr(p["second"]),
            f"{sum(a['first'] for a in p['answers'])}/{len(p['answers'])}",
            f"{sum(a['right'] for a in p['answers'])}/{len(p['answers'])}"] for p in points]
    rows = [[t["tau"], f"{t['clear']}/{t['positions']}", f"{t['fires']}/{t['queries']}", t["right"],
             t["first_token"], t["fires_in_v"], t["right_in_v"]] for t in report["thresholds"]]
    return (f"bench ready-exit: {report['model']}, {len(report['dbs'])} Spider databases streamed in "
            f"{report['batches']} batches, {report['spider_per_batch']} Spider dev + 3 stream questions per batch; "
            f"full answers: p50 {report['full_tokens_p50']:.0f} tokens, {report['full_ms_p50']:.0f} ms\n\n"
            "ready positions (one per batch)\n\n"
            + markdown_table(["database", "rows", "context tokens", "ready top token", "gap", "2nd token",
                              "= answers' 1st token", "exit right"], pos)
            + "\nthe exit by threshold (fires: gap > tau and not a stop token; right: module doc; "
              "in V: the paper's fast-answer vocabulary too)\n\n"
            + markdown_table(["tau", "positions clearing", "queries it answers", "right",
                              "= answer's 1st token", "fires in V", "right in V"], rows) + "\n")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for db in report["dbs"]:
        ps = [p for p in report["points"] if p["db"] == db]
        axes[0].plot([p["rows"] for p in ps], [p["gap"] for p in ps], "o-", label=db)
    for t in report["thresholds"]:
        axes[0].axhline(t["tau"], color="grey", lw=0.6, ls=":")
    axes[0].set_xlabel("rows in the cache")
    axes[0].set_ylabel("ready top-1 minus top-2 logit")
    axes[0].legend(fontsize=7)
    taus = [str(t["tau"]) for t in report["thresholds"]]
    xs = range(len(taus))
    total = max(1, report["thresholds"][0]["queries"])
    axes[1].bar([x - 0.2 for x in xs], [t["fires"] / total for t in report["thresholds"]], 0.4, label="exit fires")
    axes[1].bar([x + 0.2 for x in xs], [t["right"] / total for t in report["thresholds"]], 0.4, label="exit right")
    axes[1].set_xticks(list(xs), taus)
    axes[1].set_xlabel("tau")
    axes[1].set_ylabel("share of queries")
    axes[1].set_ylim(0, 1.05)
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out/ready-exit"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--db", nargs="+", default=list(STREAMS))
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--max-rows", type=int, default=48)
    parser.add_argument("--spider", type=int, default=2, help="Spider dev questions per batch")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    run_ready_exit_bench(a.out, a.model, a.db, a.batches, a.max_rows, a.spider, a.max_new_tokens, a.threads, a.seed)


if __name__ == "__main__":
    main()
