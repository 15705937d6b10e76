"""One figure for one or several runs: accuracy with 95% intervals beside TTFT p50.

Uses matplotlib's Agg backend (no display, safe in CI and on servers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend first)


def plot_runs(runs: Sequence[tuple[str, dict[str, Any]]], path: Path) -> Path:
    """Write a PNG to `path`: left, execution accuracy and exact match per run; right, TTFT p50.

    `runs` are (label, summary) pairs, summaries as `summary.summarize` returns.
    """
    labels = [label for label, _ in runs]
    xs = range(len(runs))
    fig, (acc_ax, ttft_ax) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(runs) + 4), 4))
    width = 0.38
    bars = ((-width / 2, "execution_accuracy", "execution"), (width / 2, "exact_match", "exact match"))
    for offset, key, name in bars:
        values = [100 * (s.get(key) or 0.0) for _, s in runs]
        errors = _errors([s.get(key) for _, s in runs], [s.get(f"{key}_ci95") for _, s in runs], scale=100)
        acc_ax.bar([x + offset for x in xs], values, width, yerr=errors, capsize=4, label=name)
    acc_ax.set_ylabel("accuracy (%) with 95% CI")
    acc_ax.set_ylim(0, 105)
    acc_ax.set_xticks(list(xs), labels, rotation=20)
    acc_ax.legend(loc="lower right")
    ttft = [s.get("ttft_p50_ms") for _, s in runs]
    ttft_ax.bar(list(xs), [t or 0.0 for t in ttft], 0.6,
                yerr=_errors(ttft, [s.get("ttft_p50_ci95_ms") for _, s in runs]), capsize=4, color="tab:green")
    for x, t in zip(xs, ttft):
        if t is None:
            ttft_ax.text(x, 0, "n/a", ha="center", va="bottom")
    ttft_ax.set_ylim(bottom=0)
    ttft_ax.set_ylabel("TTFT p50 (ms) with 95% CI")
    ttft_ax.set_xticks(list(xs), labels, rotation=20)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _errors(values: Sequence[float | None], cis: Sequence[list[float] | None], scale: float = 1.0) -> list[list[float]]:
    """Asymmetric error bars [[below...], [above...]]; zero where a value or interval is missing."""
    below, above = [], []
    for value, ci in zip(values, cis):
        if value is None or not ci:
            below.append(0.0)
            above.append(0.0)
        else:
            below.append(max(0.0, (value - ci[0]) * scale))
            above.append(max(0.0, (ci[1] - value) * scale))
    return [below, above]
