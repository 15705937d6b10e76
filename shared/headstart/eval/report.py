"""Write one run's results: eval.json (summary + per-question rows), eval.md, eval.png.

eval.json is flat at the top (`n`, `skipped`, `execution_accuracy`,
`exact_match`, `ttft_p50_ms`, ...), with the run's options under `config` and
the rows under `questions`; `compare_runs` reads it back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from headstart.eval.checked import CHECKED_HEADER, CHECKED_RULE, checked_row
from headstart.eval.errors import DatasetError
from headstart.eval.plots import plot_runs
from headstart.eval.records import QuestionResult

EVAL_JSON = "eval.json"


def write_run(
    out_dir: Path, config: dict[str, Any], summary: dict[str, Any], rows: Sequence[QuestionResult]
) -> dict[str, Path]:
    """Write eval.json, eval.md and eval.png under `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {**summary, "config": config, "questions": [r.to_json() for r in rows]}
    json_path = out_dir / EVAL_JSON
    json_path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    md_path = out_dir / "eval.md"
    md_path.write_text(run_markdown(config, summary), encoding="utf-8")
    png_path = plot_runs([(config.get("mode", "run"), summary)], out_dir / "eval.png")
    return {"json": json_path, "markdown": md_path, "plot": png_path}


def load_run(path: Path) -> dict[str, Any]:
    """Read an eval.json (or the folder holding one); DatasetError when absent or malformed."""
    path = path / EVAL_JSON if path.is_dir() else path
    if not path.is_file():
        raise DatasetError(f"no {EVAL_JSON} at {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or "questions" not in data or "config" not in data:
        raise DatasetError(f"{path} is not an eval.json written by headstart (no config/questions)")
    return data


def run_markdown(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """A markdown page: the headline table, skips and errors, per-database accuracy."""
    lines = [
        f"# headstart eval: {config.get('mode')} on {config.get('dataset')}",
        "",
        f"model `{config.get('model') or '-'}`, executor `{config.get('executor')}`, rules `{config.get('rules')}`",
        "",
        HEADLINE_HEADER,
        HEADLINE_RULE,
        headline_row(str(config.get("mode")), summary),
        "",
        f"Skipped: {summary['skipped']}" + "".join(f"\n- {n} × {why}" for why, n in summary["skip_reasons"].items()),
        f"Gold errors (left out of n): {summary['gold_errors']}",
        f"Prediction errors: {summary['pred_error_codes'] or 'none'}",
        "",
        *(_checked_lines(summary["checked"]) if summary.get("checked") else []),
        "| database | n | execution | exact |",
        "|---|---:|---:|---:|",
    ]
    for db, m in summary["per_db"].items():
        lines.append(f"| {db} | {m['n']} | {pct(m['execution_accuracy'])} | {pct(m['exact_match'])} |")
    return "\n".join(lines) + "\n"


def _checked_lines(checked: dict[str, Any]) -> list[str]:
    """Greedy vs execution-checked EX on the same questions (`eval.checked`)."""
    return ["Execution-checked answers (the largest group of equal results among the candidates):", "",
            CHECKED_HEADER, CHECKED_RULE, checked_row(checked), ""]


HEADLINE_HEADER = (
    "| mode | n | skipped | execution acc. [95% CI] | exact match [95% CI] | TTFT p50 ms [95% CI] | TTFT p90 ms |"
)
HEADLINE_RULE = "|---|---:|---:|---|---|---|---:|"


def headline_row(label: str, s: dict[str, Any]) -> str:
    return (
        f"| {label} | {s['n']} | {s['skipped']} | {pct(s['execution_accuracy'], s['execution_accuracy_ci95'])} | "
        f"{pct(s['exact_match'], s['exact_match_ci95'])} | {ms(s['ttft_p50_ms'], s['ttft_p50_ci95_ms'])} | "
        f"{ms(s['ttft_p90_ms'])} |"
    )


def pct(rate: float | None, ci: list[float] | None = None) -> str:
    if rate is None:
        return "n/a"
    text = f"{100 * rate:.1f}%"
    return text + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def ms(value: float | None, ci: list[float] | None = None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")
