"""Our report of a load test: TTFT p50/p90/p99 per user class (JSON + markdown) and a plot;
for data users, the push round trip and a push's ack to its data_updated / flash_ready.

Built from the exact per-event samples the users wrote (Locust's own CSV
rounds its percentiles) plus Locust's failure counts; memory samples, when the
command took them, go into the JSON and the plot.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

from bench.common import markdown_table, percentile, write_json

NOT_COUNTING_COMPUTED = {"rest_complete"}  # its JSON answer has no computed_tokens_at_submit
HEADER = ["user class", "sessions opened", "rejected", "rejection p50 ms", "rejection p99 ms", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms",
          "keystroke RTT p50 ms", "keystroke RTT p99 ms", "last token p50 ms", "computed at submit",
          "failures", "timeouts"]
DATA_HEADER = ["data user class", "sessions opened", "pushes", "rows pushed", "rejected", "push p50 ms", "push p99 ms",
               "ack→data_updated p50 ms", "ack→data_updated p99 ms", "ack→flash_ready p50 ms",
               "ack→flash_ready p99 ms", "flash answers", "failures", "timeouts"]


def load_samples(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ms(ok: dict[str, list[dict]], name: str) -> list[float]:
    return [s["ms"] for s in ok.get(name, [])]


def _pct(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if values else None


def summarize(samples: list[dict]) -> dict[str, dict]:
    """Per user class: counts and percentiles of each figure."""
    by_user: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_user[s["user"]][s["name"]].append(s)
    out = {}
    for user, names in sorted(by_user.items()):
        ok = {name: [s for s in rows if not s["error"]] for name, rows in names.items()}
        errors = [s for rows in names.values() for s in rows if s["error"]]
        ttft, rtt = _ms(ok, "ttft"), _ms(ok, "keystroke_rtt")
        last, rejected = [s["ms"] for s in ok.get("last_token", [])], [s["ms"] for s in ok.get("rejected", [])]
        computed = [s["length"] for s in ok.get("ttft", [])] if user not in NOT_COUNTING_COMPUTED else []
        out[user] = {
            "num_opened": len(ok.get("open", [])), "num_answers": len(ttft), "num_rejected": len(rejected),
            "rejection_p50_ms": _pct(rejected, 50), "rejection_p99_ms": _pct(rejected, 99),
            "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90), "ttft_p99_ms": _pct(ttft, 99),
            "keystroke_rtt_p50_ms": _pct(rtt, 50), "keystroke_rtt_p99_ms": _pct(rtt, 99),
            "num_keystrokes": len(rtt), "last_token_p50_ms": _pct(last, 50), "last_token_p99_ms": _pct(last, 99),
            "computed_at_submit_mean": round(sum(computed) / len(computed), 1) if computed else None,
            "num_failures": len(errors), "num_timeouts": sum(1 for s in errors if s["error"] == "TimeoutError"),
            "failures_by_kind": dict(sorted(_count(f"{s['name']}:{s['error']}" for s in errors).items())),
        }
        if "push" in names:  # a data user (loadtest/users.py DataUser)
            push, updated, flash = _ms(ok, "push"), _ms(ok, "data_updated"), _ms(ok, "flash_ready")
            out[user].update({
                "is_data_user": True, "num_pushes": len(push),
                "num_rows_pushed": sum(s["length"] for s in ok.get("push", [])),
                "push_p50_ms": _pct(push, 50), "push_p99_ms": _pct(push, 99),
                "data_updated_p50_ms": _pct(updated, 50), "data_updated_p99_ms": _pct(updated, 99),
                "num_flash_answers": len(flash), "flash_ready_p50_ms": _pct(flash, 50),
                "flash_ready_p99_ms": _pct(flash, 99),
            })
    return out


def _count(keys) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for k in keys:
        counts[k] += 1
    return counts


def locust_totals(prefix: Path) -> dict:
    """Request and failure counts of Locust's `*_stats.csv` (its Aggregated row)."""
    path = Path(f"{prefix}_stats.csv")
    if not path.is_file():
        return {}
    for row in csv.DictReader(path.open()):
        if row["Name"] == "Aggregated":
            return {"num_requests": int(row["Request Count"]), "num_failures": int(row["Failure Count"])}
    return {}


def _v(x):
    return "-" if x is None else x


def table_rows(summary: dict[str, dict]) -> list[list]:
    """The typing and completion users' rows (data users have a table of their own)."""
    v = _v
    return [[user, s["num_opened"], s["num_rejected"], v(s["rejection_p50_ms"]), v(s["rejection_p99_ms"]), v(s["ttft_p50_ms"]),
             v(s["ttft_p90_ms"]), v(s["ttft_p99_ms"]), v(s["keystroke_rtt_p50_ms"]), v(s["keystroke_rtt_p99_ms"]),
             v(s["last_token_p50_ms"]), v(s["computed_at_submit_mean"]), s["num_failures"], s["num_timeouts"]]
            for user, s in summary.items() if not s.get("is_data_user")]


def data_table_rows(summary: dict[str, dict]) -> list[list]:
    """The data users' rows: push round trip, a push's ack to its data_updated and flash_ready."""
    v = _v
    return [[user, s["num_opened"], s["num_pushes"], s["num_rows_pushed"], s["num_rejected"], v(s["push_p50_ms"]),
             v(s["push_p99_ms"]), v(s["data_updated_p50_ms"]), v(s["data_updated_p99_ms"]),
             v(s["flash_ready_p50_ms"]), v(s["flash_ready_p99_ms"]), s["num_flash_answers"], s["num_failures"],
             s["num_timeouts"]]
            for user, s in summary.items() if s.get("is_data_user")]


def faults_text(faults: dict) -> str:
    """The faults injected (loadtest/faults.py) and what they cost."""
    lines = [f"- {f['kind']}: killed at {f.get('killed_at_s', '?')} s, back at {f.get('back_at_s', '?')} s"
             for f in faults["injected"]]
    acked, errors = faults["acked"], faults["errors"]
    lines.append(f"- acknowledged rows lost: {acked['lost_rows']} of {acked['acked_rows']} "
                 f"({acked['sessions']} data sessions; behind their newest ack: {len(acked['sessions_behind'])})")
    lines.append(f"- failed requests: {errors['errors']}, untyped: {errors['untyped']}; by code: {errors['by_code']}")
    return "faults:\n\n" + "\n".join(lines) + "\n"


# trend key -> row label; replica_heap: glibc's bytes in use inside the replica
# (its probe), which a leak grows and allocator fragmentation does not
MEMORY_ROWS = {"gateway": "gateway", "replicas": "replicas", "replica_heap": "replica heap in use"}


def memory_table(trend: dict) -> str:
    if "gateway" not in trend:
        return f"memory: {trend.get('verdict', 'not sampled')}\n"
    rows = [[label, t["start_mib"], t["warm_mib"], t["end_mib"], t["max_mib"], t["change_mib"],
             "flat" if t["flat"] else ("GROWING" if t["growing"] else "falling")] for label, t in ((MEMORY_ROWS[k], trend[k]) for k in MEMORY_ROWS
                                                                   if k in trend)]
    return markdown_table(["process", "start MiB", "warm MiB (2nd quarter)", "end MiB (last quarter)", "max MiB",
                           "change MiB", "verdict"], rows)


def write_report(out_dir: Path, meta: dict, memory: list[dict] | None = None, trend: dict | None = None) -> str:
    """Write loadtest.json, loadtest.md and loadtest.png under `out_dir`; returns the markdown."""
    samples = load_samples(out_dir / "samples.jsonl")
    summary = summarize(samples)
    totals = locust_totals(out_dir / "locust")
    md = f"# load test `{meta.get('scenario')}`\n\n" + ", ".join(f"{k}={v}" for k, v in meta.items()
                                                              if k != "faults") + "\n\n"
    md += markdown_table(HEADER, table_rows(summary))
    data_rows = data_table_rows(summary)
    if data_rows:
        md += "\n" + markdown_table(DATA_HEADER, data_rows)
    md += f"\nLocust: {totals.get('num_requests', '?')} request events, {totals.get('num_failures', '?')} failures\n"
    if meta.get("faults"):
        md += "\n" + faults_text(meta["faults"])
    if trend is not None:
        md += "\n" + memory_table(trend)
    write_json(out_dir / "loadtest.json", {"meta": meta, "users": summary, "locust": totals,
                                           "memory_trend": trend, "memory": memory or []})
    (out_dir / "loadtest.md").write_text(md)
    _plot(out_dir / "loadtest.png", samples, memory or [], meta)
    return md


def _plot(path: Path, samples: list[dict], memory: list[dict], meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if memory else 1, figsize=(12 if memory else 6, 4), squeeze=False)
    ax = axes[0][0]
    by_user: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        if s["name"] == "ttft" and not s["error"]:
            by_user[s["user"]].append(s["ms"])
    for user, values in sorted(by_user.items()):
        xs = sorted(values)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{user} (n={len(xs)})")
    ax.set(xlabel="TTFT (ms)", ylabel="fraction of answers", title=f"TTFT per user class: {meta.get('scenario')}")
    ax.grid(alpha=0.3)
    if by_user:
        ax.legend(fontsize=8)
    if memory:
        ax = axes[0][1]
        t = [m["t_s"] / 60 for m in memory]
        ax.plot(t, [m["gateway_mib"] or 0 for m in memory], label="gateway (+ Ray driver)")
        ax.plot(t, [sum(m["replicas_mib"].values()) for m in memory], label="engine replica(s)")
        heap = [(m["t_s"] / 60, m["replica_probe"]["heap_in_use_mib"]) for m in memory
                if (m.get("replica_probe") or {}).get("heap_in_use_mib") is not None]
        if heap:
            ax.plot(*zip(*heap), marker=".", label="replica heap in use (glibc)")
        ax.set(xlabel="minutes", ylabel="RSS (MiB)", title="memory")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
