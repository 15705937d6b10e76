"""Our report of a load test: per user class the figures people compare
(TTFT, ITL, the complete answer, output tokens/s, requests/s, errors) in
JSON, CSV, Markdown tables and a plot; the typing figures and the data users
in tables of their own.

Built from the exact per-event samples the users wrote (`loadtest.summary`;
Locust's own CSV rounds its percentiles) plus Locust's totals; memory
samples, when the command took them, go into the JSON and the plot.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

from bench.common import markdown_table, write_json
from loadtest.summary import summarize

HEADER = ["user class", "answers", "answers/s", "output tok/s", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms",
          "ITL p50 ms", "ITL p99 ms", "answer p50 ms", "answer p99 ms", "failures", "timeouts"]
TYPING_HEADER = ["user class", "sessions opened", "rejected", "rejection p50 ms", "rejection p99 ms",
                 "keystroke RTT p50 ms", "keystroke RTT p99 ms", "computed at submit"]
DATA_HEADER = ["data user class", "sessions opened", "pushes", "rows pushed", "rejected", "push p50 ms", "push p99 ms",
               "ack→data_updated p50 ms", "ack→data_updated p99 ms", "ack→flash_ready p50 ms",
               "ack→flash_ready p99 ms", "flash answers", "failures", "timeouts"]
CSV_FIELDS = ["answers_per_s", "output_tokens_per_s", "num_answers", "output_tokens", "ttft_p50_ms", "ttft_p90_ms",
              "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "answer_p50_ms", "answer_p99_ms", "num_opened",
              "num_rejected", "keystroke_rtt_p50_ms", "keystroke_rtt_p99_ms", "computed_at_submit_mean",
              "num_failures", "num_timeouts", "window_s"]


def load_samples(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    """The answering users' rows: what a person waits for and what the server delivers."""
    v = _v
    return [[user, s["num_answers"], v(s["answers_per_s"]), v(s["output_tokens_per_s"]), v(s["ttft_p50_ms"]),
             v(s["ttft_p90_ms"]), v(s["ttft_p99_ms"]), v(s["itl_p50_ms"]), v(s["itl_p99_ms"]),
             v(s["answer_p50_ms"]), v(s["answer_p99_ms"]), s["num_failures"], s["num_timeouts"]]
            for user, s in summary.items() if not s.get("is_data_user") and (s["num_answers"] or s["num_failures"])]


def typing_rows(summary: dict[str, dict]) -> list[list]:
    """Users that open sessions or type: admission and keystroke round trips."""
    v = _v
    return [[user, s["num_opened"], s["num_rejected"], v(s["rejection_p50_ms"]), v(s["rejection_p99_ms"]),
             v(s["keystroke_rtt_p50_ms"]), v(s["keystroke_rtt_p99_ms"]), v(s["computed_at_submit_mean"])]
            for user, s in summary.items()
            if not s.get("is_data_user") and (s["num_opened"] or s["num_keystrokes"] or s["num_rejected"])]


def write_csv(path: Path, summary: dict[str, dict]) -> None:
    """One row per user class, the figures of `CSV_FIELDS`."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["user_class", *CSV_FIELDS])
        for user, s in summary.items():
            writer.writerow([user, *("" if s.get(k) is None else s[k] for k in CSV_FIELDS)])


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
    lines = [f"- {f['kind']}: killed at {f.get('killed_at_s', '?')} s, " + (
             f"{f.get('processes', '?')} processes of Ray node {f.get('node')}" if f["kind"] == "node-kill"
             else f"back at {f.get('back_at_s', '?')} s") for f in faults["injected"]]
    if faults.get("sessions"):
        s = faults["sessions"]
        lines.append(f"- typed sessions open at the kill: {s['through_kill']} ({s['killed_mid_typing']} mid-typing, "
                     f"{s['killed_mid_answer']} mid-answer): {s['continued']} continued, {s['lost']} lost "
                     f"{s['lost_codes'] or ''}; answers identical to a cold run: {s['identical']} of {s['answered']} "
                     f"({s['identical_through_kill']} of {s['answered_through_kill']} through the kill)")
    acked, errors = faults["acked"], faults["errors"]
    lines.append(f"- acknowledged rows lost: {acked['lost_rows']} of {acked['acked_rows']} "
                 f"({acked['sessions']} data sessions; behind their newest ack: {len(acked['sessions_behind'])}; "
                 f"every session caught up {acked.get('caught_up_s_max')} s after the load stopped)")
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
    """Write loadtest.json, loadtest.csv, loadtest.md and loadtest.png under `out_dir`; returns the markdown."""
    samples = load_samples(out_dir / "samples.jsonl")
    summary = summarize(samples)
    totals = locust_totals(out_dir / "locust")
    md = f"# load test `{meta.get('scenario')}`\n\n" + ", ".join(f"{k}={v}" for k, v in meta.items()
                                                              if k != "faults") + "\n\n"
    md += markdown_table(HEADER, table_rows(summary))
    typing = typing_rows(summary)
    if typing:
        md += "\n" + markdown_table(TYPING_HEADER, typing)
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
    write_csv(out_dir / "loadtest.csv", summary)
    _plot(out_dir / "loadtest.png", samples, summary, memory or [], meta)
    return md


def _cdf(ax, by_user: dict[str, list[float]], xlabel: str, title: str) -> None:
    for user, values in sorted(by_user.items()):
        xs = sorted(values)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{user} (n={len(xs)})")
    ax.set(xlabel=xlabel, ylabel="fraction", title=title)
    ax.grid(alpha=0.3)
    if by_user:
        ax.legend(fontsize=7)


def _plot(path: Path, samples: list[dict], summary: dict[str, dict], memory: list[dict], meta: dict) -> None:
    """TTFT, ITL and answer-time CDFs per class, output tokens/s per class, memory over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3 if memory else 2, figsize=(16 if memory else 11, 8), squeeze=False)
    figures: dict[str, dict[str, list[float]]] = {"ttft": defaultdict(list), "itl": defaultdict(list),
                                                  "answer": defaultdict(list)}
    for s in samples:
        if s["error"] or s["name"] not in figures:
            continue
        if s["name"] == "itl":
            figures["itl"][s["user"]] += s.get("values", [])
        elif s["ms"] is not None:
            figures[s["name"]][s["user"]].append(s["ms"])
    scenario = meta.get("scenario")
    _cdf(axes[0][0], figures["ttft"], "TTFT (ms)", f"TTFT per user class: {scenario}")
    _cdf(axes[0][1], figures["itl"], "inter-token latency (ms)", "ITL (every gap)")
    _cdf(axes[1][0], figures["answer"], "complete answer (ms)", "asked → the last token")
    ax = axes[1][1]
    rates = {u: s["output_tokens_per_s"] for u, s in summary.items() if s.get("output_tokens_per_s")}
    ax.barh(list(rates), list(rates.values()))
    ax.set(xlabel="output tokens/s", title="output tokens per second per class")
    ax.grid(alpha=0.3, axis="x")
    if memory:
        ax = axes[0][2]
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
        axes[1][2].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
