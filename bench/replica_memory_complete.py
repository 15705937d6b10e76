"""Do stateless completions leak on a replica? The Complete half of issue 14.

`bench.replica_memory` cycles typing sessions; the soak's other users call
Complete (gRPC `Complete`, REST `/v1/complete`): prefix mode, four databases,
a different question each time. This drives the replica's Complete path
in-process (`start_complete` on a thread, then `generation_events`, as
`services.engine.deployment.EngineDeployment.Complete` does) in cycles: each
cycle asks `per_db` questions of every database, `concurrency` at a time (their
forwards batch), then waits until the worker and the pump threads are idle
and takes the probe's snapshot (live engine objects, tensors, heap, RSS).

A leak grows some count every cycle; warm caches (a P0 per database, prompt
builders, tokenizer caches) stop growing after the first cycle.

    python -m bench.replica_memory_complete --cycles 8 --out bench-out/replica-memory-complete
"""

from __future__ import annotations

import argparse
import asyncio
import tracemalloc
from pathlib import Path

from bench.common import markdown_table, spider_questions, write_json
from bench.replica_memory import _malloc_trim, growth, serve_complete, settle
from services.engine.core import ReplicaCore
from services.engine.memory_probe import rss_mib, snapshot

DBS = ("world_1", "concert_singer", "pets_1", "car_1")


def questions(db: str, count: int) -> list[str]:
    """`count` distinct questions on `db` (Spider's dev set when present, else made up)."""
    try:
        found = list(dict.fromkeys(q["question"] for q in spider_questions([db], count, 0)))
    except (OSError, ValueError, KeyError):  # no Spider dev set: distinct made-up questions do as well
        found = []
    return (found + [f"How many rows are in table number {i} of {db}?" for i in range(count)])[:count]


async def run_cycle(core: ReplicaCore, cycle: int, dbs: tuple[str, ...], per_db: int, max_new: int,
                    concurrency: int, repeat: bool = False) -> int:
    """Ask every db `per_db` questions (a different slice each cycle, or the
    same ones with `repeat`); returns how many were asked."""
    first = 0 if repeat else per_db * cycle
    asks = [(db, q) for db in dbs for q in questions(db, first + per_db)[first:]]
    for first in range(0, len(asks), concurrency):
        await asyncio.gather(*(serve_complete(core, db, q, max_new) for db, q in asks[first:first + concurrency]))
    await settle(core)
    return len(asks)


def run_experiment(core: ReplicaCore, cycles: int, dbs: tuple[str, ...] = DBS, per_db: int = 3, max_new: int = 4,
                   concurrency: int = 2, trim: bool = False, repeat: bool = False,
                   say=lambda row: None) -> list[dict]:
    """Snapshots before the first cycle and after each: [{cycle, asked, probe, rss_after_trim}].

    trim: after each snapshot, hand freed heap back to the OS (glibc's
    malloc_trim) and read RSS again: RSS that grows while `rss_after_trim`
    does not is memory the allocator keeps, not memory the replica holds.
    repeat: the same questions every cycle (the same shapes: per-shape kernel
    caches stop growing) instead of new ones."""
    rows = [{"cycle": 0, "asked": 0, "sessions": 0, "evicted": 0, "probe": snapshot().as_dict(),
             "rss_after_trim": _malloc_trim() if trim else 0.0}]
    loop = asyncio.new_event_loop()
    try:
        for cycle in range(1, cycles + 1):
            asked = loop.run_until_complete(run_cycle(core, cycle, dbs, per_db, max_new, concurrency, repeat))
            rows.append({"cycle": cycle, "asked": asked, "sessions": len(core.runtime.sessions),
                         "evicted": core.runtime.sessions.evicted, "probe": snapshot().as_dict()})
            rows[-1]["rss_after_trim"] = _malloc_trim() if trim else 0.0
            say(rows[-1])
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    from headstart.config import EngineSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--fast-path", default="auto", help="the engine's kernels (HEADSTART_FAST_PATH)")
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--per-db", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--repeat", action="store_true", help="the same questions every cycle (new ones by default)")
    ap.add_argument("--trim", action="store_true", help="malloc_trim after each cycle's snapshot (RSS after it too)")
    ap.add_argument("--out", type=Path, default=Path("bench-out/replica-memory-complete"))
    args = ap.parse_args(argv)
    tracemalloc.start()
    settings = EngineSettings(model=args.model, dtype=args.dtype, threads=2, debounce_ms=0.0,
                              p0_cache_on_disk=False, fast_path=args.fast_path)
    core = ReplicaCore(settings, max_attached=settings.max_sessions)
    print("kernels:", core.runtime.fast_path, flush=True)
    try:
        rows = run_experiment(core, args.cycles, per_db=args.per_db, max_new=args.max_new,
                              concurrency=args.concurrency, trim=args.trim, repeat=args.repeat,
                              say=lambda r: print(r["cycle"], r["asked"], f"tensors {r['probe']['num_tensors']}",
                                                  f"{r['probe']['tensor_bytes'] / 2**20:.1f} MiB",
                                                  f"gc {r['probe']['gc_objects']}",
                                                  f"heap {r['probe']['traced_bytes'] / 2**20:.2f} MiB",
                                                  f"RSS {r['probe']['rss_mib']:.1f} MiB",
                                                  f"trimmed {r['rss_after_trim']:.1f} MiB", flush=True))
        trim = {"rss_mib_before_trim": rss_mib(), "rss_mib_after_trim": _malloc_trim()}
    finally:
        core.shutdown()
    warm = min(2, len(rows) - 1)
    result = {"config": vars(args) | {"out": str(args.out)}, "rows": rows, "trim": trim,
              "growth_after_warmup": growth(rows, warm)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "replica_memory_complete.json", result)
    header = ["cycle", "asked", "KVState", "PagedCache", "BlockTable", "GenerationRequest", "Job", "threads", "tensors",
              "tensor MiB", "gc objects", "py heap MiB", "RSS MiB", "RSS trimmed"]
    table = [[r["cycle"], r["asked"], *(r["probe"]["counts"].get(n, 0) for n in header[2:7]),
              r["probe"]["num_threads"], r["probe"]["num_tensors"], f"{r['probe']['tensor_bytes'] / 2**20:.2f}",
              r["probe"]["gc_objects"], f"{r['probe']['traced_bytes'] / 2**20:.2f}",
              f"{r['probe']['rss_mib']:.1f}", f"{r['rss_after_trim']:.1f}"] for r in rows]
    text = markdown_table(header, table)
    text += f"\n\ngrowth from cycle {warm} to {rows[-1]['cycle']}: {result['growth_after_warmup']}\n"
    text += f"malloc_trim: {trim}\n"
    (args.out / "replica_memory_complete.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
