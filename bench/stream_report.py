"""bench stream's report: stream.md (tables) and stream.png (latency vs context tokens)."""

from __future__ import annotations

from pathlib import Path

from bench.common import markdown_table

LABELS = {"reprefill": "re-prefill (cold)", "prefix": "prefix cache", "stateful": "stateful session",
          "flash": "flash hit (Redis)"}


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def markdown(report: dict) -> str:
    r = report
    summary = [[LABELS[m], _ms(v["p50_ms"]), _ms(v["p99_ms"]), _ms(v["first_ms"]), _ms(v["last_ms"]),
                f"{v['growth']:.2f}"] for m, v in r["modes"].items()]
    per = [[p["iteration"], p["rows"], p["context_tokens"], _ms(p["reprefill_ms"]), _ms(p["prefix_ms"]),
            _ms(p["stateful_ms"]), _ms(p["flash_ms"]), _ms(p["ingest_ms"]), _ms(p["flash_eval_ms"]),
            "yes" if p["stateful_match"] else "NO"] for p in r["iterations_detail"]]
    d, s = r["shift_drift"], r["last_speedup"]
    return (f"bench stream: {r['model']} {r['dtype']} on {r['device']} ({r['threads']} threads); "
            f"{r['rows_start']} rows, then {r['iterations']} x ({r['rows_per_iteration']} rows + 1 query); "
            f"{r['new_tokens']} answer tokens; question {r['question_tokens']} tokens, frozen region "
            f"{r['frozen_tokens']} tokens; flash answers by {r['flash_source']}, looked up with LiveStore.lookup\n\n"
            + markdown_table(["mode", "p50 ms", "p99 ms", "first ms", "last ms", "growth last/first"], summary)
            + f"\nlast iteration: stateful {s['stateful_vs_reprefill']:.1f}x faster than re-prefill; "
              f"flash hit {s['flash_vs_stateful']:.0f}x faster than stateful\n\n"
              f"outputs_identical (stateful tokens == re-prefill tokens, every iteration): {r['outputs_identical']}; "
              f"prefix == re-prefill: {r['prefix_identical']}; flash answer == stateful answer: "
              f"{r['flash_identical']}; rows dropped: {r['rows_dropped']}\n\n"
              f"shift drift (bound {d['bound_tokens']} tokens, {d['shifts']} shifts, {d['retired']} rows retired, "
              f"{d['rows_in_cache']} kept): max |logit diff| of the first answer token vs a cold prefill "
              f"{d['max_logit_diff']:.2e}, greedy answer matches: {d['greedy_match']}\n\n"
              "per iteration (ingest and flash eval run in the background, before the query; not in its latency)\n\n"
            + markdown_table(["iter", "rows", "context tokens", "re-prefill ms", "prefix ms", "stateful ms",
                              "flash ms", "ingest ms", "flash eval ms", "same tokens"], per))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    points = report["iterations_detail"]
    xs = [p["context_tokens"] for p in points]
    for mode, marker in zip(LABELS, "so^d"):
        axes[0].plot(xs, [p[f"{mode}_ms"] for p in points], marker + "-", label=LABELS[mode])
    axes[0].set_yscale("log")
    axes[0].set_xlabel("context tokens (frozen + rows)")
    axes[0].set_ylabel("query ms (log)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("query latency per iteration")
    modes = report["modes"]
    names = list(modes)
    axes[1].bar([LABELS[m] for m in names], [modes[m]["p50_ms"] for m in names],
                color=["tab:blue", "tab:orange", "tab:green", "tab:red"])
    for i, m in enumerate(names):
        axes[1].annotate(f"{_ms(modes[m]['p50_ms'])} ms\ngrowth {modes[m]['growth']:.2f}", (i, modes[m]["p50_ms"]),
                         ha="center", va="bottom", fontsize=8)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("p50 ms (log)")
    axes[1].set_ylim(top=max(modes[m]["p50_ms"] for m in names) * 4)  # room for the labels
    axes[1].tick_params(axis="x", labelsize=8)
    axes[1].set_title("p50 over the iterations")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
