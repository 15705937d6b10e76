"""Does a replica leak, or does its session LRU fill? A directed experiment.

The soak (issue 14) saw a replica's RSS grow ~10 MiB/min for 30 minutes.
Instead of waiting, this drives one replica's code in-process (ReplicaCore +
SessionStream + generation streaming: everything of a Serve replica but Ray)
through cycles far past the session cap. Each cycle serves `per_cycle`
sessions, each typed and submitted, and ends them every way a client does:

- closed: the gateway's CloseSession after the stream ended (WebSocket /
  gRPC typists of the load test);
- abandoned: the stream ended, no close (a gateway that died, a REST/gRPC
  session left to expire): it stays in the LRU until evicted;
- left mid-answer: the stream ended after the first token (cancelled), no close;

plus one stateless Complete. After each cycle the engine-side probe
(`services.engine.memory_probe`) counts live sessions, KV states, caches,
requests, jobs, tasks, threads, tensor bytes and the Python heap.

A leak grows some count every cycle; an LRU plateau stops at the cap:
sessions <= max_sessions, tensor bytes <= weights + P0s + max_sessions x a
session's private KV bytes (the bound, printed).

    python -m bench.replica_memory --cycles 12 --out bench-out/replica-memory
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import tracemalloc
from pathlib import Path

from bench.common import markdown_table, write_json
from headstart.v1 import engine_pb2, types_pb2
from services.engine.core import ReplicaCore
from services.engine.generate import generation_events
from services.engine.memory_probe import rss_mib, snapshot
from services.engine.stream import SessionStream

QUESTIONS = [
    "How many cities are there in each country?",
    "What is the average life expectancy in Europe?",
    "Which languages are official in more than 3 countries?",
]
ENDINGS = ("closed", "abandoned", "left")


async def serve_session(core: ReplicaCore, sid: str, db: str, question: str, ending: str, max_new: int) -> str:
    """One session's stream on the replica; returns how it ended."""
    queue: asyncio.Queue = asyncio.Queue()
    words = question.split(" ")
    texts = [" ".join(words[: i + 1]) for i in range(len(words))]
    queue.put_nowait(engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id=sid, db=db, seq=1, text=texts[0])))
    for seq, text in enumerate(texts[1:], 2):
        queue.put_nowait(engine_pb2.EngineRequest(snapshot=engine_pb2.Snapshot(seq=seq, text=text)))
    params = types_pb2.SamplingParams(max_new_tokens=max_new)
    queue.put_nowait(engine_pb2.EngineRequest(submit=engine_pb2.EngineSubmit(seq=len(texts) + 1, text=question,
                                                                            params=params)))

    async def requests():
        while True:
            yield await queue.get()

    stream = SessionStream(core, "replica-probe").run(requests())
    outcome = "error"
    async for event in stream:
        kind = event.WhichOneof("kind")
        if kind == "tokens" and ending == "left":
            outcome = "left"
            break
        if kind == "result":
            outcome = "done"
            break
        if kind == "error":
            break
    await stream.aclose()
    if ending == "closed":
        core.close(sid)
    return outcome


async def serve_complete(core: ReplicaCore, db: str, question: str, max_new: int) -> None:
    from headstart.engine.requests.generation import SamplingParams

    runtime = core.runtime
    gen = await asyncio.to_thread(runtime.start_complete, db, question, "prefix", SamplingParams(max_new_tokens=max_new))
    async for _ in generation_events(gen, runtime.prompt_for(db).decode, "replica-probe", 0):
        pass


async def run_cycle(core: ReplicaCore, cycle: int, per_cycle: int, db: str, max_new: int,
                    concurrency: int = 1) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    for first in range(0, per_cycle, concurrency):  # `concurrency` sessions at once: their forwards batch
        got = await asyncio.gather(*(
            serve_session(core, f"c{cycle}-s{j}", db, QUESTIONS[j % len(QUESTIONS)], ENDINGS[j % len(ENDINGS)], max_new)
            for j in range(first, min(per_cycle, first + concurrency))))
        for outcome in got:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    await serve_complete(core, db, QUESTIONS[cycle % len(QUESTIONS)], max_new)
    await settle(core)
    return outcomes


async def settle(core: ReplicaCore, timeout_s: float = 30.0, quiet_s: float = 0.3) -> None:
    """Wait until cancelled work is gone: nothing queued or running on the worker
    and no generation pump thread left (they hold their request until they end),
    for `quiet_s` in a row (a session's timers can still start a step, e.g.
    answer-ahead after a pause, just after the worker first looks idle)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    since = None
    while loop.time() < end:
        pumps = [t for t in threading.enumerate() if t.name == "headstart-gen-pump"]
        if not pumps and core.info().num_queued == 0:
            since = loop.time() if since is None else since
            if loop.time() - since >= quiet_s:
                return
        else:
            since = None
        await asyncio.sleep(0.02)


def run_experiment(core: ReplicaCore, cycles: int, per_cycle: int, db: str = "world_1",
                   max_new: int = 4, concurrency: int = 1, say=lambda row: None) -> list[dict]:
    """Snapshots before the first cycle and after each: [{cycle, outcomes, sessions, evicted, probe}]."""
    rows = [{"cycle": 0, "outcomes": {}, "sessions": len(core.runtime.sessions), "evicted": 0,
             "probe": snapshot().as_dict()}]
    loop = asyncio.new_event_loop()
    try:
        for cycle in range(1, cycles + 1):
            outcomes = loop.run_until_complete(run_cycle(core, cycle, per_cycle, db, max_new, concurrency))
            rows.append({"cycle": cycle, "outcomes": outcomes, "sessions": len(core.runtime.sessions),
                         "evicted": core.runtime.sessions.evicted, "probe": snapshot().as_dict()})
            say(rows[-1])
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return rows


def session_bound_bytes(core: ReplicaCore) -> dict[str, int]:
    """The plateau's bound: KV bytes of the sessions held now, and per session at most."""
    usage = core.runtime.sessions.kv_usage()
    limits = core.runtime.limits
    per_session = limits.max_prompt_tokens * core.runtime.kv_memory.bytes_per_token
    return {"session_bytes_now": usage.session_bytes, "shared_bytes_now": usage.shared_bytes,
            "max_sessions": core.runtime.sessions.max_sessions, "max_bytes_per_session": per_session,
            "bound_bytes": usage.shared_bytes + core.runtime.sessions.max_sessions * per_session}


def growth(rows: list[dict], start: int, settled: int = 1) -> dict[str, int]:
    """Per watched count and byte figure: the value after the last cycle minus the value
    after cycle `start`; with `settled` > 1, the least such growth over the last
    `settled` cycles. A leak grows with every cycle and shows in each of them; an
    object something holds for a moment after a cycle (a cancelled task's frame not
    yet dropped) shows in one, and is not a leak."""
    first = rows[start]["probe"]
    lasts = [row["probe"] for row in rows[-settled:]]
    names = sorted(set(first["counts"]).union(*(last["counts"] for last in lasts)))
    out = {name: min(last["counts"].get(name, 0) for last in lasts) - first["counts"].get(name, 0) for name in names}
    for key in ("tensor_bytes", "num_tensors", "gc_objects", "traced_bytes", "num_threads"):
        out[key] = min(last[key] for last in lasts) - first[key]
    return out


def _malloc_trim() -> float:
    """RSS after glibc's malloc_trim(0): what the allocator kept of freed memory (0.0: not glibc)."""
    from services.engine.memory_probe import malloc_trim

    return malloc_trim() or 0.0


def main(argv: list[str] | None = None) -> None:
    from headstart.config import EngineSettings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-sessions", type=int, default=8)
    ap.add_argument("--per-cycle", type=int, default=12)
    ap.add_argument("--cycles", type=int, default=12)
    ap.add_argument("--max-new", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=1, help="sessions served at once (their forwards batch)")
    ap.add_argument("--out", type=Path, default=Path("bench-out/replica-memory"))
    args = ap.parse_args(argv)
    tracemalloc.start()
    settings = EngineSettings(model=args.model, dtype=args.dtype, threads=2, max_sessions=args.max_sessions,
                              debounce_ms=0.0, p0_cache_on_disk=False)
    core = ReplicaCore(settings, max_attached=args.max_sessions)
    try:
        rows = run_experiment(core, args.cycles, args.per_cycle, max_new=args.max_new, concurrency=args.concurrency,
                              say=lambda r: print(r["cycle"], r["sessions"], r["evicted"],
                                                  f"tensors {r['probe']['tensor_bytes'] / 2**20:.1f} MiB",
                                                  f"RSS {r['probe']['rss_mib']:.1f} MiB", flush=True))
        bound = session_bound_bytes(core)
        bound["rss_mib_before_trim"], bound["rss_mib_after_trim"] = rss_mib(), _malloc_trim()
    finally:
        core.shutdown()
    warm = min(2, len(rows) - 1)  # the LRU is full after the first cycle when per_cycle > max_sessions
    result = {"config": vars(args) | {"out": str(args.out)}, "rows": rows, "bound": bound,
              "growth_after_warmup": growth(rows, warm)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "replica_memory.json", result)
    header = ["cycle", "sessions", "evicted", "Session", "KVState", "PagedCache", "BlockTable", "Job", "Task", "threads",
              "tensor MiB", "py heap MiB", "RSS MiB"]
    table = [[r["cycle"], r["sessions"], r["evicted"], *(r["probe"]["counts"].get(n, 0) for n in header[3:9]),
              r["probe"]["num_threads"], f"{r['probe']['tensor_bytes'] / 2**20:.2f}",
              f"{r['probe']['traced_bytes'] / 2**20:.2f}", f"{r['probe']['rss_mib']:.1f}"] for r in rows]
    text = markdown_table(header, table)
    text += f"\n\ngrowth from cycle {warm} to {rows[-1]['cycle']}: {result['growth_after_warmup']}\n"
    text += f"plateau bound: {bound}\n"
    (args.out / "replica_memory.md").write_text(text)
    print(text)
    _plot(rows, args.out / "replica_memory.png")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cycles = [r["cycle"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(cycles, [r["probe"]["tensor_bytes"] / 2**20 for r in rows], label="live tensors MiB")
    a.plot(cycles, [r["probe"]["traced_bytes"] / 2**20 for r in rows], label="Python heap MiB")
    a.plot(cycles, [r["probe"]["rss_mib"] for r in rows], label="RSS MiB")
    a.set_xlabel("cycle")
    a.legend()
    for name in ("Session", "KVState", "Job", "Task"):
        b.plot(cycles, [r["probe"]["counts"].get(name, 0) for r in rows], label=name)
    b.plot(cycles, [r["probe"]["num_threads"] for r in rows], label="threads")
    b.set_xlabel("cycle")
    b.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
