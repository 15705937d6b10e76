"""What a durable ack costs: a data push's store step with `appendfsync everysec` vs `always`.

Two local Redis servers with an append-only file in folders side by side (the
same disk), one per fsync policy; `--pushers` threads each push `--rows` rows
at a time into a session of their own (`LiveStore.log_push`: the step a push
waits on, numbering and logging its rows in one script). The policies run
alternately, `--rounds` rounds of `--pushes` pushes per pusher each, so a
disk's good and bad moments fall on both. Prints push latency p50 / p99 /
max and pushes per second per policy and pusher count, writes JSON and a
plot (latency distributions).

`everysec` is the baseline only: it acknowledges writes a crash can lose
(docs/faults.md); `always` is what the data store runs.

    headstart bench durability --pushers 1,4 --rounds 6 --pushes 200
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

from bench.common import cpu_name, markdown_table, percentile, write_json
from headstart.data.live_store import LiveStore
from headstart.redis_server import local_redis

POLICIES = ("everysec", "always")


def _rows(n: int, pusher: int, push: int) -> list[dict]:
    return [{"table": "city", "values": {"ID": pusher * 10_000_000 + push * 1000 + i, "Name": f"Town {i}",
                                         "CountryCode": "NLD", "District": "Zuid-Holland", "Population": 1000 + i}}
            for i in range(n)]


def _round(url: str, pushers: int, pushes: int, rows: int, tag: str) -> tuple[list[float], float]:
    """`pushers` threads, `pushes` pushes each; (latencies in ms, wall seconds)."""
    latencies: list[list[float]] = [[] for _ in range(pushers)]
    stores = [LiveStore(url, max_rows=1_000_000) for _ in range(pushers)]
    start = threading.Barrier(pushers + 1)

    def push(index: int) -> None:
        store, mine = stores[index], latencies[index]
        start.wait()
        for p in range(pushes):
            batch = _rows(rows, index, p)
            began = time.perf_counter()
            store.log_push(f"bench-{tag}-{index}", batch)
            mine.append((time.perf_counter() - began) * 1000)

    threads = [threading.Thread(target=push, args=(i,), daemon=True) for i in range(pushers)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    for store in stores:
        store.close()
    return [ms for mine in latencies for ms in mine], wall


def run_durability_bench(out: Path, pushers: list[int], rounds: int, pushes: int, rows: int,
                         folder: Path | None = None) -> dict:
    """Run the comparison (module docstring); returns the report (also written to `out`)."""
    if rounds < 1 or pushes < 1 or rows < 1 or not pushers or min(pushers) < 1:
        raise ValueError("--rounds, --pushes, --rows and every --pushers must be >= 1")
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, dict]] = {p: {n: {"ms": [], "wall_s": 0.0, "pushes": 0} for n in pushers}
                                           for p in POLICIES}
    with tempfile.TemporaryDirectory(prefix="hs-durability-", dir=folder) as tmp:
        with local_redis(dir=Path(tmp) / "everysec", aof=True, appendfsync="everysec") as everysec, \
                local_redis(dir=Path(tmp) / "always", aof=True, appendfsync="always") as always:
            servers = {"everysec": everysec, "always": always}
            for n in pushers:
                _round(always.url, n, min(pushes, 20), rows, "warm")  # connections, scripts loaded
                _round(everysec.url, n, min(pushes, 20), rows, "warm")
                for r in range(rounds):
                    order = POLICIES if r % 2 == 0 else POLICIES[::-1]  # alternate which goes first
                    for policy in order:
                        ms, wall = _round(servers[policy].url, n, pushes, rows, f"{r}")
                        cell = results[policy][n]
                        cell["ms"] += ms
                        cell["wall_s"] += wall
                        cell["pushes"] += len(ms)
    report = {"meta": {"pushers": pushers, "rounds": rounds, "pushes_per_round": pushes, "rows_per_push": rows,
                       "cpu": cpu_name(), "when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                       "note": "LiveStore.log_push on a local Redis with an append-only file, per fsync policy"},
              "results": [_summary(policy, n, results[policy][n]) for n in pushers for policy in POLICIES]}
    write_json(out / "durability.json", report)
    table = markdown_table(["pushers", "appendfsync", "pushes", "p50 ms", "p99 ms", "max ms", "pushes/s"],
                           [[r["pushers"], r["appendfsync"], r["pushes"], r["p50_ms"], r["p99_ms"], r["max_ms"],
                             r["pushes_per_s"]] for r in report["results"]])
    (out / "durability.md").write_text(table)
    print(table)
    plot(results, pushers, out / "durability.png")
    print(f"wrote {out}/durability.json, durability.md, durability.png")
    return report


def _summary(policy: str, pushers: int, cell: dict) -> dict:
    ms = cell["ms"]
    return {"appendfsync": policy, "pushers": pushers, "pushes": cell["pushes"],
            "p50_ms": round(percentile(ms, 50), 2), "p99_ms": round(percentile(ms, 99), 2),
            "max_ms": round(max(ms), 2), "mean_ms": round(sum(ms) / len(ms), 2),
            "pushes_per_s": round(cell["pushes"] / cell["wall_s"], 1) if cell["wall_s"] else 0.0}




def plot(results: dict, pushers: list[int], path: Path) -> None:
    """Latency distribution (sorted pushes, log scale) per policy and pusher count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(pushers), figsize=(5 * len(pushers), 4), squeeze=False)
    for ax, n in zip(axes[0], pushers):
        for policy in POLICIES:
            ms = sorted(results[policy][n]["ms"])
            ax.plot([100 * (i + 1) / len(ms) for i in range(len(ms))], ms, label=f"appendfsync {policy}")
        ax.set_yscale("log")
        ax.set_xlabel("percentile of pushes")
        ax.set_ylabel("push store step, ms")
        ax.set_title(f"{n} pusher{'s' if n > 1 else ''}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
