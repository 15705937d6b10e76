"""A replica's resident memory with its KV budget full (issue 45).

One engine replica behind Ray Serve (as `bench.replica_memory_serve`) with
`HEADSTART_KV_BUDGET_BYTES` set and a session cap far above what the budget
holds, so the budget is what binds. Each cycle opens `per_cycle` sessions,
each a pasted question of about `question_tokens` tokens (one prefill) and a
short answer, and leaves them open: the budget fills, then the least
recently used idle sessions are evicted to make room, cycle after cycle.
After each cycle: the replica's RSS, its peak during the cycle (VmHWM), the
KV bytes in use against the budget, and the block pool's slabs (what the
pool holds from the system: `blocks_total` x the block's bytes) against the
blocks in use. The bar (issue 45): peak RSS <= 1.5 x the GGUF file + the KV budget.

    python -m bench.replica_memory_full --budget-mib 256 --cycles 6 --out bench-out/replica-memory-full
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

from bench.common import markdown_table, spider_questions, write_json
from headstart.v1 import engine_pb2, engine_pb2_grpc, types_pb2

BOUND = 1.5


def long_question(index: int, tokens: int, pool: list[str]) -> str:
    """A pasted question of roughly `tokens` tokens (about four characters a token), distinct per index."""
    parts, n = [f"Question {index}:"], index
    while sum(len(p) + 1 for p in parts) < tokens * 4:
        parts.append(pool[n % len(pool)])
        n += 7
    return " ".join(parts)[: tokens * 4]


def pasted_session(stub, stack, sid: str, text: str, max_new: int) -> str:
    """Attach with the whole text, submit it, read the result; the session stays open (never closed)."""
    done = threading.Event()

    def requests():
        yield engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id=sid, db="world_1", seq=1, text=text))
        yield engine_pb2.EngineRequest(submit=engine_pb2.EngineSubmit(
            seq=2, text=text, params=types_pb2.SamplingParams(max_new_tokens=max_new)))
        done.wait(600)

    call = stub.Session(requests(), metadata=stack.metadata(sid), timeout=600)
    try:
        for event in call:
            kind = event.WhichOneof("kind")
            if kind == "result":
                return "done"
            if kind == "error":
                return event.error.code or "error"
        return "ended"
    finally:
        done.set()
        call.cancel()


def kv_row(probe: dict) -> dict:
    kv, per_token = probe["kv"], probe["kv_bytes_per_token"]
    block_bytes = kv["block_tokens"] * per_token
    return {"used_mib": (kv["session_bytes"] + kv["shared_bytes"] + kv["data_bytes"]) / 2**20,
            "budget_mib": kv["budget_bytes"] / 2**20, "blocks_used": kv["blocks_used"],
            "blocks_total": kv["blocks_total"], "blocks_used_mib": kv["blocks_used"] * block_bytes / 2**20,
            "slabs_mib": kv["blocks_total"] * block_bytes / 2**20}


def main(argv: list[str] | None = None) -> None:
    from ray import serve

    from headstart.config import EngineSettings
    from headstart.models.catalogue import DEFAULT_MODEL
    from loadtest.memory import peak_rss_mib, replica_pids, reset_peak_rss, rss_mib
    from services.engine.deployment import APP_NAME
    from services.engine.ray_stack import start_engine, start_ray, stop_engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--budget-mib", type=int, default=256)
    ap.add_argument("--per-cycle", type=int, default=12)
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--question-tokens", type=int, default=300)
    ap.add_argument("--max-new", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trim", action="store_true", help="after each cycle's readings, RSS after malloc_trim(0) "
                    "(allocator slack given back; each cycle then starts trimmed)")
    ap.add_argument("--out", type=Path, default=Path("bench-out/replica-memory-full"))
    args = ap.parse_args(argv)
    gguf_mib = _gguf_mib(args.model)
    pool = [q["question"] for q in spider_questions(["world_1"], 50, 0)] or ["How many cities are there?"]
    ray_dir = Path(tempfile.mkdtemp(prefix="hsf", dir="/tmp"))
    ray_auth = start_ray(ray_dir, num_cpus=2)
    rows = []
    try:
        settings = EngineSettings(model=args.model, dtype="float32", threads=args.threads, max_sessions=4096,
                                  debounce_ms=0.0, p0_cache_on_disk=False, kv_budget_bytes=args.budget_mib << 20)
        stack = start_engine(settings, num_replicas=1, max_attached=4096)
        handle = serve.get_app_handle(APP_NAME)
        pid = replica_pids()[0]
        import grpc

        with grpc.insecure_channel(stack.grpc_target) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            for cycle in range(args.cycles + 1):
                outcomes: dict[str, int] = {}
                reset_peak_rss(pid)
                started = time.perf_counter()
                for j in range(args.per_cycle if cycle else 0):
                    n = cycle * args.per_cycle + j
                    got = pasted_session(stub, stack, f"full-{n}", long_question(n, args.question_tokens, pool),
                                         args.max_new)
                    outcomes[got] = outcomes.get(got, 0) + 1
                time.sleep(0.5)  # answer-ahead after the last answer ends
                rss, peak = rss_mib(pid), peak_rss_mib(pid)
                probe = handle.memory_probe.remote(trim=args.trim).result()
                rows.append({"cycle": cycle, "outcomes": outcomes, "seconds": round(time.perf_counter() - started, 1),
                             "sessions": probe["num_sessions"], "evicted": probe["evicted"], "rss_mib": rss,
                             "peak_rss_mib": peak, "tensor_mib": probe["tensor_bytes"] / 2**20,
                             "rss_trimmed_mib": probe.get("rss_trimmed_mib"),
                             "heap_in_use_mib": (probe.get("malloc") or {}).get("in_use_mib", 0.0),
                             "heap_free_held_mib": (probe.get("malloc") or {}).get("free_held_mib", 0.0),
                             **kv_row(probe)})
                print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    finally:
        stop_engine()
        ray_auth.cleanup()
        shutil.rmtree(ray_dir, ignore_errors=True)
    peak = max(r["peak_rss_mib"] or r["rss_mib"] for r in rows)
    bound = BOUND * gguf_mib + args.budget_mib
    verdict = {"gguf_mib": round(gguf_mib, 1), "budget_mib": args.budget_mib, "peak_rss_mib": round(peak, 1),
               "bound_mib": round(bound, 1), "ratio": round(peak / (gguf_mib + args.budget_mib), 2),
               "within": peak <= bound}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "replica_memory_full.json", {"config": vars(args) | {"out": str(args.out)}, "rows": rows,
                                                       "verdict": verdict})
    header = ["cycle", "sessions", "evicted", "KV used MiB", "blocks used MiB", "pool slabs MiB", "tensors MiB",
              "heap in use MiB", "heap free kept MiB", "RSS MiB", "peak RSS MiB", "RSS after trim"]
    table = markdown_table(header, [[r["cycle"], r["sessions"], r["evicted"], f"{r['used_mib']:.1f}",
                                     f"{r['blocks_used_mib']:.1f}", f"{r['slabs_mib']:.1f}", f"{r['tensor_mib']:.1f}",
                                     f"{r['heap_in_use_mib']:.1f}", f"{r['heap_free_held_mib']:.1f}",
                                     f"{r['rss_mib']:.1f}", f"{r['peak_rss_mib'] or 0:.1f}",
                                     "" if r["rss_trimmed_mib"] is None else f"{r['rss_trimmed_mib']:.1f}"] for r in rows])
    text = table + (f"\n\npeak RSS {verdict['peak_rss_mib']} MiB; bar {BOUND} x GGUF {verdict['gguf_mib']} + budget "
                    f"{args.budget_mib} = {verdict['bound_mib']} MiB: {'within' if verdict['within'] else 'ABOVE'}; "
                    f"{verdict['ratio']} x (GGUF + budget)\n")
    (args.out / "replica_memory_full.md").write_text(text)
    print(text)


def _gguf_mib(model: str) -> float:
    """Size of the model's GGUF file (0 for a model that has none: random weights)."""
    if model.startswith("random:"):
        return 0.0
    from headstart.models.install import ensure_model

    return Path(ensure_model(model)).stat().st_size / 2**20


if __name__ == "__main__":
    main()
