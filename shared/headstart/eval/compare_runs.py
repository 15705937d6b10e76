"""Paired comparison of several runs over the same questions (e.g. cold vs session).

The first run is the baseline. For every other run: on the questions both
scored, how many flipped right→wrong and wrong→right, the accuracy change,
and McNemar's exact p-value, because "within noise" must be shown, not said.
Writes compare.json, compare.md and compare.png.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from headstart.eval.errors import ConfigError
from headstart.eval.plots import plot_runs
from headstart.eval.records import STATUS_SCORED
from headstart.eval.report import HEADLINE_HEADER, HEADLINE_RULE, headline_row, load_run
from headstart.eval.stats import paired_comparison


def compare_runs(paths: Sequence[Path], out_dir: Path) -> dict[str, Any]:
    """Load each eval.json in `paths`, pair them against the first, write the comparison."""
    if len(paths) < 2:
        raise ConfigError(f"comparison needs at least two runs, got {len(paths)}")
    runs = [load_run(Path(p)) for p in paths]
    labels = _labels(runs, [Path(p) for p in paths])
    _check_same_questions(runs, labels)
    correct = [_correct_by_index(run) for run in runs]
    texts = [_text_by_index(run) for run in runs]
    pairs = []
    for label, answers, text in zip(labels[1:], correct[1:], texts[1:]):
        result = paired_comparison(correct[0], answers)
        flips = sorted(set(correct[0]) & set(answers))
        differ = [i for i in flips if texts[0][i] != text[i]]
        pairs.append({
            "baseline": labels[0],
            "other": label,
            **asdict(result),
            "right_to_wrong_indices": [i for i in flips if correct[0][i] and not answers[i]],
            "wrong_to_right_indices": [i for i in flips if not correct[0][i] and answers[i]],
            # the exactness promise, question by question: the same answer text as the baseline's
            "same_text": len(flips) - len(differ),
            "different_text_indices": differ,
        })
    summaries = [{k: v for k, v in run.items() if k != "questions"} for run in runs]
    payload = {"runs": dict(zip(labels, summaries)), "pairs": pairs}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    (out_dir / "compare.md").write_text(compare_markdown(labels, summaries, pairs), encoding="utf-8")
    plot_runs(list(zip(labels, summaries)), out_dir / "compare.png")
    return payload


def compare_markdown(labels: list[str], summaries: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> str:
    lines = ["# headstart eval: paired comparison", "", HEADLINE_HEADER, HEADLINE_RULE]
    lines += [headline_row(label, s) for label, s in zip(labels, summaries)]
    lines += [
        "",
        f"Paired against `{labels[0]}` on the questions both scored "
        "(McNemar exact test; p ≥ 0.05 means no detectable difference):",
        "",
        "| other | n paired | both right | both wrong | right→wrong | wrong→right | Δ accuracy | McNemar p "
        "| same answer text |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in pairs:
        delta = "n/a" if p["delta"] is None else f"{100 * p['delta']:+.1f} pp"
        lines.append(
            f"| {p['other']} | {p['n']} | {p['both_right']} | {p['both_wrong']} | {p['right_to_wrong']} | "
            f"{p['wrong_to_right']} | {delta} | {p['p_value']:.3g} | {p['same_text']} of {p['n']} |"
        )
    return "\n".join(lines) + "\n"


def _labels(runs: list[dict[str, Any]], paths: list[Path]) -> list[str]:
    modes = [str(run["config"].get("mode", "run")) for run in runs]
    folders = [p.name if p.is_dir() else p.parent.name for p in paths]
    return [m if modes.count(m) == 1 else f"{m} ({folder})" for m, folder in zip(modes, folders)]


def _correct_by_index(run: dict[str, Any]) -> dict[int, bool]:
    return {int(q["index"]): bool(q["correct"]) for q in run["questions"] if q["status"] == STATUS_SCORED}


def _text_by_index(run: dict[str, Any]) -> dict[int, str]:
    return {int(q["index"]): q.get("pred_text", "") for q in run["questions"] if q["status"] == STATUS_SCORED}


def _check_same_questions(runs: list[dict[str, Any]], labels: list[str]) -> None:
    """Pairing is only meaningful on the same questions: same dataset, same gold per index."""
    base = {int(q["index"]): q["gold_sql"] for q in runs[0]["questions"]}
    for label, run in zip(labels[1:], runs[1:]):
        if run["config"].get("dataset") != runs[0]["config"].get("dataset"):
            raise ConfigError(
                f"run {label!r} is on dataset {run['config'].get('dataset')!r}, "
                f"the baseline on {runs[0]['config'].get('dataset')!r}"
            )
        for q in run["questions"]:
            if base.get(int(q["index"]), q["gold_sql"]) != q["gold_sql"]:
                raise ConfigError(f"run {label!r} has different gold SQL at question {q['index']}")
