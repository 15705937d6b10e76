"""Which of a noisy tenant's loads delays the gateway's event loop? Measured apart.

One asyncio loop with the gateway's lag probe (`services.gateway.loop_lag`)
runs for `--seconds` per condition, beside one noisy load at a time:

- `idle`: nothing else;
- `runs-threads`: `--runs` heavy Runs (`bench.neighbour.HEAVY_SQL`, to the
  deadline, again and again) on threads of this process at niceness 10, as
  the gateway ran them before (SQLite's progress handler takes the GIL about
  every millisecond in each thread);
- `runs-processes`: the same Runs in a pool of worker processes at the idle CPU
  priority (SCHED_IDLE; what the gateway does now: no GIL shared with the loop);
- `refusals`: the loop itself answering `--flood` WebSocket-sized messages
  per second of 3000 characters the way the WebSocket edge refuses a
  rate-limited input (size check, rate check, error JSON).

Prints loop lag p50/p99/max per condition and writes JSON. Run it on a quiet
machine; the lag of `idle` is the floor.

    python -m bench.gateway_loop_lag --seconds 8 --out bench-out/loop-lag
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

from bench.common import markdown_table, write_json
from bench.neighbour import HEAVY_SQL
from services.gateway.databases import RunLimits, run_read_only
from services.gateway.loop_lag import LoopLagProbe
from services.gateway.runs import RunPool

CONDITIONS = ("idle", "runs-threads", "runs-processes", "refusals")


def _db(folder: Path) -> Path:
    path = folder / "t.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    return path


def _runs_on_threads(path: Path, limits: RunLimits, n: int, stop: threading.Event) -> list[threading.Thread]:
    def loop():
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while not stop.is_set():
            try:
                run_read_only(path, HEAVY_SQL, limits)
            except Exception:  # CANCELLED at the deadline: run again
                pass

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


async def _runs_on_processes(pool: RunPool, path: Path, limits: RunLimits, n: int, stop: asyncio.Event) -> None:
    async def one():
        while not stop.is_set():
            try:
                await pool.run(path, HEAVY_SQL, limits)
            except Exception:
                pass

    await asyncio.gather(*(one() for _ in range(n)))


async def _refusals(per_s: int, stop: asyncio.Event) -> None:
    from services.gateway.limits import RateLimiter, check_size
    from services.gateway.ws import error_json

    limiter = RateLimiter(1.0, 1)
    text = json.dumps({"type": "input", "seq": 1, "text": "x" * 3000})
    while not stop.is_set():
        for _ in range(max(1, per_s // 100)):
            try:
                check_size(len(text.encode()), 1 << 20)
                limiter.take()
            except Exception as exc:
                json.dumps(error_json(getattr(exc, "code", "X"), str(exc)))
        await asyncio.sleep(0.01)


async def measure(condition: str, seconds: float, path: Path, runs: int, flood: int, pool: RunPool) -> dict:
    limits = RunLimits(rows=100, cell_bytes=4096, total_bytes=1 << 20, value_bytes=1 << 20, timeout_s=2.0)
    stop_async, stop_threads = asyncio.Event(), threading.Event()
    background = None
    if condition == "runs-threads":
        threads = _runs_on_threads(path, limits, runs, stop_threads)
    elif condition == "runs-processes":
        background = asyncio.create_task(_runs_on_processes(pool, path, limits, runs, stop_async))
    elif condition == "refusals":
        background = asyncio.create_task(_refusals(flood, stop_async))
    await asyncio.sleep(0.5)
    probe = LoopLagProbe(0.002).start()
    await asyncio.sleep(seconds)
    stats = probe.stats()
    probe.stop()
    stop_async.set()
    stop_threads.set()
    if background is not None:
        await background
    if condition == "runs-threads":
        for t in threads:
            await asyncio.to_thread(t.join, 5)
    return {"condition": condition, **stats, "load_avg_1m": os.getloadavg()[0]}


async def main_async(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = _db(Path(folder))
        pool = RunPool(args.runs)
        if "runs-processes" in args.conditions:
            await asyncio.to_thread(pool.warm)
        try:
            for condition in args.conditions:
                rows.append(await measure(condition, args.seconds, path, args.runs, args.flood, pool))
                print(rows[-1], flush=True)
        finally:
            pool.shutdown()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--flood", type=int, default=200, help="refused messages per second")
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=CONDITIONS)
    ap.add_argument("--out", type=Path, default=Path("bench-out/loop-lag"))
    args = ap.parse_args(argv)
    started = time.perf_counter()
    rows = asyncio.run(main_async(args))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "loop_lag.json", {"config": vars(args) | {"out": str(args.out)}, "rows": rows,
                                            "wall_s": time.perf_counter() - started})
    table = markdown_table(["condition", "samples", "lag p50 ms", "lag p99 ms", "lag max ms", "load 1m"],
                           [[r["condition"], r["samples"], f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                             f"{r['max_ms']:.1f}", f"{r['load_avg_1m']:.1f}"] for r in rows])
    (args.out / "loop_lag.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
