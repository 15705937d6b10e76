"""Helpers every benchmark shares: percentiles, Spider questions, output files."""

from __future__ import annotations

import json
import os
import platform
import random
from pathlib import Path

from headstart.paths import default_spider_dir


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize_ms(values: list[float]) -> dict:
    return {
        "mean_ms": sum(values) / len(values) if values else float("nan"),
        "p50_ms": percentile(values, 50), "p90_ms": percentile(values, 90), "p99_ms": percentile(values, 99),
    }


def spider_questions(dbs: list[str], n: int, seed: int, spider_dir: Path | None = None) -> list[dict]:
    """`n` Spider dev questions spread round-robin over `dbs`, seeded."""
    data = json.loads(((spider_dir or default_spider_dir()) / "dev.json").read_text())
    rng = random.Random(seed)
    pools = {db: [q for q in data if q["db_id"] == db] for db in dbs}
    for db, pool in pools.items():
        if not pool:
            raise ValueError(f"no Spider dev questions for database {db!r}")
        rng.shuffle(pool)
    picked = []
    for i in range(n):
        db = dbs[i % len(dbs)]
        pool = pools[db]
        picked.append(pool[(i // len(dbs)) % len(pool)])
    return [{"db_id": q["db_id"], "question": q["question"], "query": q["query"]} for q in picked]


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=float))


def markdown_table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def cpu_name() -> str:
    """This machine's CPU as /proc/cpuinfo names it, and its core count (a benchmark's JSON says where it ran)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine()
