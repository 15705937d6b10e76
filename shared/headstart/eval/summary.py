"""Turn per-question rows into the numbers a report shows, with their 95% intervals.

Accuracy is over *scored* questions (n): skipped questions (missing database)
and gold errors are counted and reported beside it, never silently dropped.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from headstart.eval.records import STATUS_GOLD_ERROR, STATUS_SCORED, STATUS_SKIPPED, QuestionResult
from headstart.eval.stats import quantile_interval, wilson_interval


def summarize(rows: Sequence[QuestionResult]) -> dict[str, Any]:
    """Metrics of one run: n, skipped, execution_accuracy, exact_match, TTFT percentiles, per db."""
    scored = [r for r in rows if r.status == STATUS_SCORED]
    ex = wilson_interval(sum(bool(r.correct) for r in scored), len(scored))
    em = wilson_interval(sum(bool(r.exact) for r in scored), len(scored))
    ttfts = [r.ttft_ms for r in scored if r.ttft_ms is not None]
    p50 = quantile_interval(ttfts, 0.5)
    p90 = quantile_interval(ttfts, 0.9)
    skipped = [r for r in rows if r.status == STATUS_SKIPPED]
    return {
        "total": len(rows),
        "n": len(scored),
        "skipped": len(skipped),
        "skip_reasons": dict(Counter(r.skip_reason or "" for r in skipped)),
        "gold_errors": sum(r.status == STATUS_GOLD_ERROR for r in rows),
        "num_correct": ex.k,
        "execution_accuracy": ex.rate,
        "execution_accuracy_ci95": _pair(ex.lo, ex.hi),
        "num_exact": em.k,
        "exact_match": em.rate,
        "exact_match_ci95": _pair(em.lo, em.hi),
        "num_ttft": len(ttfts),
        "ttft_p50_ms": p50.value,
        "ttft_p50_ci95_ms": _pair(p50.lo, p50.hi),
        "ttft_p90_ms": p90.value,
        "ttft_mean_ms": sum(ttfts) / len(ttfts) if ttfts else None,
        "pred_error_codes": dict(Counter(r.pred_error_code for r in scored if r.pred_error_code)),
        "per_db": _per_db(scored),
    }


def _per_db(scored: Sequence[QuestionResult]) -> dict[str, dict[str, Any]]:
    out = {}
    for db in sorted({r.db_id for r in scored}):
        mine = [r for r in scored if r.db_id == db]
        out[db] = {
            "n": len(mine),
            "execution_accuracy": sum(bool(r.correct) for r in mine) / len(mine),
            "exact_match": sum(bool(r.exact) for r in mine) / len(mine),
        }
    return out


def _pair(lo: float | None, hi: float | None) -> list[float] | None:
    return None if lo is None or hi is None else [lo, hi]
