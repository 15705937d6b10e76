"""What a keystroke costs in CPU on each path of a session stream: direct to the replica, or
through Serve's gRPC proxy (services/engine/direct.py).

One local stack (`headstart serve`'s, random:tiny, one torch thread) and two gateways
on it: the stack's own (direct streams) and a second one with `engine_direct=False`.
Phases alternate (direct, proxy, proxy, direct, ...); in each, N typists send keystrokes
at `--rate` a second for `--seconds` over the public gRPC API, and the CPU time of Serve's
proxy, the replica and this process (both gateways and the typists) is read from /proc.
The replica's column includes its forwards (one per keystroke here), which both paths
pay alike; the difference between the paths is the stream's own cost.

    python -m bench.stream_path --typists 8 --rate 5 --seconds 15 --phases 4 --out bench-out/stream-path
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from bench.common import markdown_table, write_json

TEXT = "How many singers are there whose age is above the average age of all singers in France and Spain?"
PROCESSES = {"proxy": "ProxyActor", "replica": "ServeReplica"}


def _cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    import psutil

    out = {}
    for name, group in pids.items():
        total = 0.0
        for pid in group:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        out[name] = total
    return out


def _stack_pids() -> dict[str, list[int]]:
    import psutil

    found: dict[str, list[int]] = {name: [] for name in PROCESSES}
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        for name, marker in PROCESSES.items():
            if marker in line:
                found[name].append(proc.pid)
    return found | {"gateway+typists": [os.getpid()]}


def _phase(grpc_target: str, token: str, db: str, typists: int, rate: float, seconds: float) -> int:
    """N typists on `grpc_target` for `seconds`; returns the keystrokes sent."""
    from headstart.client import HeadstartClient

    sent = [0] * typists
    with HeadstartClient(grpc_target, token, timeout_s=300) as client:
        sessions = [client.typing(db) for _ in range(typists)]
        start = time.monotonic()

        def typist(k: int) -> None:
            due = start + k / (typists * rate)
            i = 0
            while due - start < seconds:
                time.sleep(max(0.0, due - time.monotonic()))
                i = i % len(TEXT) + 1
                sessions[k].input(TEXT[:i])
                sent[k] += 1
                due += 1.0 / rate

        threads = [threading.Thread(target=typist, args=(k,)) for k in range(typists)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in sessions:
            s.wait_caught_up(120)
            s.close()
    return sum(sent)


def run(typists: int, rate: float, seconds: float, phases: int, db: str, out: Path) -> dict:
    from services.gateway.app import GatewayServer
    from services.launcher import serve_command

    token = "stream-path-token"
    stack = serve_command(model="random:tiny", port=0, grpc_port=0, replicas=1, threads=1,
                          tokens=[f"bench={token}"], flash_worker=False, block=False, say=lambda *a: None)
    proxied = GatewayServer(stack.gateway.settings.model_copy(update={"port": 0, "grpc_port": 0,
                                                                     "engine_direct": False})).start()
    targets = {"direct": stack.grpc_target, "proxy": f"127.0.0.1:{proxied.grpc_port}"}
    try:
        _phase(targets["direct"], token, db, 1, rate, 1.0)  # P0 of the database, off the clock
        pids = _stack_pids()
        samples = []
        for p in range(phases):
            for path in (("direct", "proxy") if p % 2 == 0 else ("proxy", "direct")):
                before = _cpu_seconds(pids)
                keys = _phase(targets[path], token, db, typists, rate, seconds)
                after = _cpu_seconds(pids)
                samples.append({"phase": p, "path": path, "keys": keys,
                                "cpu_s": {k: after[k] - before[k] for k in after}})
        paths = {s["path"] for s in samples}
        opened = dict(stack.gateway.service.direct.opened_by_path)
    finally:
        proxied.stop()
        stack.stop()
    rows = []
    for path in sorted(paths):
        mine = [s for s in samples if s["path"] == path]
        keys = sum(s["keys"] for s in mine)
        per_key = {k: 1000 * sum(s["cpu_s"][k] for s in mine) / keys for k in mine[0]["cpu_s"]}
        rows.append({"path": path, "keys": keys, **{f"{k}_ms_per_key": v for k, v in per_key.items()},
                     "total_ms_per_key": sum(per_key.values())})
    result = {"config": {"typists": typists, "rate": rate, "seconds": seconds, "phases": phases, "db": db},
              "rows": rows, "samples": samples, "direct_gateway_streams": opened}
    write_json(out / "stream_path.json", result)
    header = ["path", "keystrokes", "proxy ms/key", "replica ms/key", "gateway+typists ms/key", "total ms/key"]
    table = markdown_table(header, [[r["path"], r["keys"], r["proxy_ms_per_key"], r["replica_ms_per_key"],
                                     r["gateway+typists_ms_per_key"], r["total_ms_per_key"]] for r in rows])
    (out / "stream_path.md").write_text(table)
    _plot(rows, out / "stream_path.png")
    return result | {"table": table}


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = ["proxy", "replica", "gateway+typists"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottoms = [0.0] * len(rows)
    for part in parts:
        values = [r[f"{part}_ms_per_key"] for r in rows]
        ax.bar([r["path"] for r in rows], values, bottom=bottoms, label=part)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_ylabel("CPU ms per keystroke")
    ax.set_title("a keystroke's CPU by stream path (random:tiny, 1 thread)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--typists", type=int, default=8)
    parser.add_argument("--rate", type=float, default=5.0, help="keystrokes per second per typist")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of one phase")
    parser.add_argument("--phases", type=int, default=4, help="pairs of phases (direct and proxy, alternating)")
    parser.add_argument("--db", default="concert_singer")
    parser.add_argument("--out", type=Path, default=Path("bench-out/stream-path"))
    ns = parser.parse_args(argv)
    result = run(ns.typists, ns.rate, ns.seconds, ns.phases, ns.db, ns.out)
    print(result["table"])
    print(f"streams opened by the direct gateway: {result['direct_gateway_streams']}; wrote {ns.out}/stream_path.*")


if __name__ == "__main__":
    main()
