"""The table-cache benchmark's outputs: tables.json, a markdown table (tables.md) and a plot (tables.png)."""

from __future__ import annotations

from pathlib import Path

from bench.common import markdown_table, percentile, write_json


def mode_summary(name: str, ttfts_ms: list[float], *, hit_rate: float, **extra) -> dict:
    """The per-mode numbers every row of the report has, plus `extra`."""
    return {
        "total_ttft_s": sum(ttfts_ms) / 1000.0,
        "p50_ms": percentile(ttfts_ms, 50),
        "p99_ms": percentile(ttfts_ms, 99),
        "mean_ms": sum(ttfts_ms) / len(ttfts_ms),
        "hit_rate": hit_rate,
        "num_requests": len(ttfts_ms),
        "ttft_ms": ttfts_ms,
        **extra,
    }


def criteria(report: dict) -> dict:
    """The issue's done-when: pfk total TTFT <= 1/3 of cold and <= 1/2 of prefix caching."""
    modes = report["modes"]
    pfk = modes["pfk"]["total_ttft_s"]
    vs_cold, vs_prefix = pfk / modes["cold"]["total_ttft_s"], pfk / modes["prefix"]["total_ttft_s"]
    return {"pfk_vs_cold": vs_cold, "pfk_vs_prefix": vs_prefix, "met": vs_cold <= 1 / 3 and vs_prefix <= 1 / 2}


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report["criteria"] = criteria(report)
    write_json(out / "tables.json", report)
    text = render(report)
    (out / "tables.md").write_text(text)
    print("\n" + text)
    plot(report, out / "tables.png")


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def render(report: dict) -> str:
    c, modes, abl = report["config"], report["modes"], report["ablations"]
    cold = modes["cold"]["total_ttft_s"]
    header = ["run", "total TTFT s", "vs cold", "p50 ms", "p99 ms", "hit rate", "device hits", "MiB from store",
              "evictions", "round totals s"]

    def row(name: str, s: dict) -> list:
        dev = s.get("device_hit_rate")
        return [name, s["total_ttft_s"], f"{s['total_ttft_s'] / cold:.3f}", s["p50_ms"], s["p99_ms"],
                f"{s['hit_rate']:.3f}", "-" if dev is None else f"{dev:.3f}", _mib(s.get("bytes_from_store")),
                s.get("tier_evictions", s.get("evictions", "-")),
                " / ".join(f"{t:.1f}" for t in s.get("round_totals_s", [s["total_ttft_s"]]))]

    lines = [f"Table cache, {c['model']} {c['dtype']} on {c['device']} ({c['threads']} threads), {c['dataset']}, "
             f"{c['questions']} questions (random order, tables shuffled per question, seed {c['seed']}), "
             f"mean prompt {c['prompt_tokens_mean']:.0f} tokens, store {c['store']}, device tier "
             f"{_mib(c['device_tier_bytes'])} MiB, prefix cache {_mib(c['prefix_cache_bytes'])} MiB, batches of "
             f"{c['batch_size']}, best of {c['rounds']} round(s) per run\n",
             "Modes (paper Table 1):\n", markdown_table(header, [row(m, s) for m, s in modes.items()]),
             "\nAblations of pfk (paper Tables 2 and 4):\n",
             markdown_table(header, [row(m, s) for m, s in abl.items()])]
    crit = report["criteria"]
    lines.append(f"\npfk total TTFT = {crit['pfk_vs_cold']:.3f} x cold, {crit['pfk_vs_prefix']:.3f} x prefix "
                 f"caching; done-when (<= 1/3 cold and <= 1/2 prefix): {'met' if crit['met'] else 'NOT met'}\n")
    pre = report.get("precompute", {})
    for mode, p in pre.items():
        lines.append(f"precompute {mode}: {p['num_tables']} tables in {p['num_groups']} groups over "
                     f"{p['num_databases']} dbs, {p['num_tokens_encoded']} tokens, {_mib(p['num_bytes_stored'])} MiB, "
                     f"{p['seconds']:.1f} s (offline, not in any TTFT)\n")
    guard = report.get("accuracy_guard") or {}
    if guard:
        gh = ["vs full prefill", "top-1 agreement", "first divergence", "whole continuation", "KL mean",
              "KL p50", "KL max"]
        rows = [[m, f"{g['top1_agreement_mean']:.3f}", f"{g['first_divergence_mean']:.1f}",
                 f"{g['whole_continuation_agrees']:.2f}", f"{g['kl_first_token_mean']:.4g}",
                 f"{g['kl_first_token_p50']:.4g}", f"{g['kl_first_token_max']:.4g}"]
                for m, g in guard.items() if isinstance(g, dict) and "top1_agreement_mean" in g]
        lines.append(f"\nAccuracy guard ({guard['num_questions']} questions, first {guard['num_tokens']} greedy "
                     f"tokens, first-token KL in nats):\n")
        lines.append(markdown_table(gh, rows))
    return "".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {**report["modes"], **{f"pfk/{k}": v for k, v in report["ablations"].items() if k != "lru"}}
    fig, (bars, box) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(runs)
    bars.barh(names, [runs[n]["total_ttft_s"] for n in names],
              color=["#888" if n in ("cold", "prefix") else "#2a7" for n in names])
    bars.invert_yaxis()
    bars.set_xlabel("total TTFT (s)")
    bars.set_title("total TTFT over the workload")
    modes = list(report["modes"])
    box.boxplot([[max(t, 0.01) for t in report["modes"][m]["ttft_ms"]] for m in modes], tick_labels=modes,
                showmeans=True)
    box.set_yscale("log")
    box.set_ylabel("TTFT per request (ms, log)")
    box.set_title("per-request TTFT")
    c = report["config"]
    fig.suptitle(f"table cache on {c['dataset']}, {c['questions']} questions, {c['model']} on {c['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
