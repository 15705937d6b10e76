"""The replica leak experiment of `bench/replica_memory.py`, through Ray Serve.

Same cycles (sessions closed, abandoned, left mid-answer, past the session
cap, plus a Complete), but over Serve's gRPC proxy to a real replica (one,
so every call lands on it), as the gateway calls it. After each cycle the
replica's own counts come from its `memory_probe` (a Serve handle call) and
its RSS from /proc: what the in-process experiment cannot see (Ray's and
Serve's per-request state) shows here. `peak RSS` is the highest during the
cycle's work (VmHWM, restarted before each cycle), not only where it ended.

    python -m bench.replica_memory_serve --cycles 8 --out bench-out/replica-memory-serve

With `--detail` each probe also counts live objects by type (the top growers
between cycles are printed), CPython's allocated blocks, the replica's
tables, its Prometheus samples, and RSS after `malloc_trim(0)`: RSS that
falls back under trim is allocator slack, not a leak. `--trace` adds the
source lines whose Python allocations grew most (tracemalloc; slower).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

from bench.common import markdown_table, write_json
from bench.replica_memory import ENDINGS, QUESTIONS
from headstart.v1 import engine_pb2, engine_pb2_grpc, types_pb2


def _session(stub, stack, sid: str, question: str, ending: str, max_new: int) -> str:
    done = threading.Event()
    words = question.split(" ")

    def requests():
        yield engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id=sid, db="world_1", seq=1, text=words[0]))
        for seq in range(2, len(words) + 1):
            yield engine_pb2.EngineRequest(snapshot=engine_pb2.Snapshot(seq=seq, text=" ".join(words[:seq])))
        yield engine_pb2.EngineRequest(submit=engine_pb2.EngineSubmit(
            seq=len(words) + 1, text=question, params=types_pb2.SamplingParams(max_new_tokens=max_new)))
        done.wait(120)

    call = stub.Session(requests(), metadata=stack.metadata(sid), timeout=120)
    outcome = "error"
    try:
        for event in call:
            kind = event.WhichOneof("kind")
            if kind == "tokens" and ending == "left":
                outcome = "left"
                break
            if kind in ("result", "error"):
                outcome = "done" if kind == "result" else "error"
                break
    finally:
        done.set()
        call.cancel()
    if ending == "closed":
        stub.CloseSession(engine_pb2.EngineSessionRef(session_id=sid), metadata=stack.metadata(sid), timeout=30)
    return outcome


def proxy_pid() -> int | None:
    """The Serve proxy actor's process (it carries every gRPC stream to the replica)."""
    from loadtest.memory import descendants

    for pid in descendants():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ProxyActor"):
                return pid
        except OSError:
            pass
    return None


def _print_detail(rows: list[dict]) -> None:
    from services.engine.memory_probe import top_growth

    now = rows[-1]["probe"]
    print(f"   trimmed RSS {now['rss_trimmed_mib']:.1f}  blocks {now['allocated_blocks']}  "
          f"prometheus {now['prometheus_samples']}  tables {now['tables']}  threads {now['thread_names']}")
    if len(rows) > 1:
        print("   grew:", top_growth(rows[-2]["probe"]["type_counts"], now["type_counts"], 10))
    for line in now.get("traced_growth", [])[:8]:
        print("   traced:", line)


def main(argv: list[str] | None = None) -> None:
    import grpc
    from ray import serve

    from headstart.config import EngineSettings
    from loadtest.memory import peak_rss_mib, replica_pids, reset_peak_rss, rss_mib
    from services.engine.deployment import APP_NAME
    from services.engine.ray_stack import start_engine, start_ray, stop_engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--max-sessions", type=int, default=8)
    ap.add_argument("--per-cycle", type=int, default=12)
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=4)
    ap.add_argument("--malloc-trim-s", type=float, default=0.0,
                    help="the replica's idle malloc_trim period (HEADSTART_MALLOC_TRIM_S; 0: never, the raw curve)")
    ap.add_argument("--detail", action="store_true", help="types, tables, RSS after malloc_trim per cycle")
    ap.add_argument("--trace", action="store_true", help="tracemalloc: the lines whose allocations grew")
    ap.add_argument("--out", type=Path, default=Path("bench-out/replica-memory-serve"))
    args = ap.parse_args(argv)
    ray_dir = Path(tempfile.mkdtemp(prefix="hsm", dir="/tmp"))
    ray_auth = start_ray(ray_dir, num_cpus=2)
    rows = []
    try:
        settings = EngineSettings(model=args.model, dtype="float32", threads=2, max_sessions=args.max_sessions,
                                  debounce_ms=0.0, p0_cache_on_disk=False, malloc_trim_s=args.malloc_trim_s)
        stack = start_engine(settings, num_replicas=1, max_attached=args.max_sessions)
        handle = serve.get_app_handle(APP_NAME)
        pid = replica_pids()[0]
        proxy = proxy_pid()
        with grpc.insecure_channel(stack.grpc_target) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            for cycle in range(args.cycles + 1):
                outcomes: dict[str, int] = {}
                reset_peak_rss(pid)  # the peak column: the highest RSS during this cycle's work
                for j in range(args.per_cycle if cycle else 0):
                    ending = ENDINGS[j % len(ENDINGS)]
                    got = _session(stub, stack, f"c{cycle}-s{j}", QUESTIONS[j % len(QUESTIONS)], ending, args.max_new)
                    outcomes[got] = outcomes.get(got, 0) + 1
                if cycle:
                    request = engine_pb2.EngineCompleteRequest(db="world_1", question=QUESTIONS[cycle % 3],
                                                               params=types_pb2.SamplingParams(max_new_tokens=4))
                    list(stub.Complete(request, metadata=stack.metadata(), timeout=120))
                time.sleep(0.5)  # cancelled work ends
                rss, peak = rss_mib(pid), peak_rss_mib(pid)  # before the probe: with --detail it trims
                probe = handle.memory_probe.remote(detail=args.detail, trim=args.detail, trace=args.trace).result()
                rows.append({"cycle": cycle, "outcomes": outcomes, "probe": probe, "rss_mib": rss, "peak_rss_mib": peak,
                             "proxy_rss_mib": rss_mib(proxy) if proxy else None})
                print(cycle, outcomes, probe["num_sessions"], probe["evicted"], probe["counts"],
                      probe["gc_objects"], f"{probe['tensor_bytes'] / 2**20:.2f} MiB", f"RSS {rows[-1]['rss_mib']:.1f}",
                      f"proxy {rows[-1]['proxy_rss_mib']}", flush=True)
                if args.detail:
                    _print_detail(rows)
    finally:
        stop_engine()
        ray_auth.cleanup()
        shutil.rmtree(ray_dir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "replica_memory_serve.json", {"config": vars(args) | {"out": str(args.out)}, "rows": rows})
    header = ["cycle", "sessions", "evicted", "Session", "KVState", "Job", "Task", "gc objects", "tensor MiB",
              "RSS MiB", "peak RSS MiB", "RSS after trim", "blocks", "proxy RSS"]
    table = markdown_table(header, [[r["cycle"], r["probe"]["num_sessions"], r["probe"]["evicted"],
                                     *(r["probe"]["counts"].get(n, 0) for n in ("Session", "KVState", "Job", "Task")),
                                     r["probe"]["gc_objects"], f"{r['probe']['tensor_bytes'] / 2**20:.2f}",
                                     f"{r['rss_mib']:.1f}", _mib(r.get("peak_rss_mib")), _mib(r["probe"].get("rss_trimmed_mib")),
                                     r["probe"].get("allocated_blocks", ""), _mib(r["proxy_rss_mib"])]
                                    for r in rows])
    (args.out / "replica_memory_serve.md").write_text(table + "\n")
    print(table)


def _mib(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    main()
