"""`bench ttft --candidates K`: the time to the execution-checked answer beside the greedy one.

Each mode decodes K candidates (the sessions during the pause, handed over
at Enter; cold and prefix from Enter on), and `CheckedAnswers` runs the
finished candidates' SQL off the forward worker and chooses. The checked
time of a question is from Enter (the TTFT clock's start) to the choice
with its rows: without `--candidates-wait-all` among the greedy answer and
the candidates ready when it ends (a submit never waits for more); with it,
among all K. JSON fields are named `checked_*`.
"""

from __future__ import annotations

import time

from bench.common import summarize_ms
from headstart.candidates import CheckedAnswers
from headstart.engine.requests.candidates import CandidateParams


def make_checker(checked: CheckedAnswers, db: str, wait_all: bool):
    """The `checker` of `replay_in_mode`: the checked answer of a request, timed from its start."""

    def check(request) -> dict:
        choice = checked.check(db, request, wait_all=wait_all).result()
        return {"checked_ms": (time.perf_counter() - request.started) * 1000.0, "checked_index": choice.index,
                "checked_agreed": choice.agreed, "checked_candidates": choice.num_candidates,
                "checked_failed": len(choice.failed), "checked_sql": choice.sql, "checked_rows": len(choice.rows)}

    return check


def candidate_params(k: int, wait_all: bool, seed: int) -> CandidateParams | None:
    return CandidateParams(k, seed=seed, wait_all=wait_all) if k > 1 else None


def row_fields(extra: dict) -> dict:
    """A bench row's `checked_*` fields from a result's `extra`, and whether every
    candidate had ended before Enter (`checked_ready_at_enter`: nothing left to decode)."""
    fields = {k: v for k, v in extra.items() if k.startswith("checked_")}
    if "checked_ms" in fields and extra.get("candidates_ready_at_submit") is not None:
        fields["checked_ready_at_enter"] = extra["candidates_ready_at_submit"] >= extra["candidates_k"]
    return fields


def mode_stats(rows: list[dict]) -> dict:
    """A mode's `checked_*` statistics (empty without candidates)."""
    times = [r["checked_ms"] for r in rows if r.get("checked_ms") is not None]
    if not times:
        return {}
    summary = summarize_ms(times)
    totals = summarize_ms([r["total_ms"] for r in rows])
    return {"checked_p50_ms": summary["p50_ms"], "checked_p99_ms": summary["p99_ms"],
            "checked_p50_vs_greedy_complete": summary["p50_ms"] / totals["p50_ms"],
            "checked_changed_rate": sum(r["checked_index"] != 0 for r in rows) / len(rows),
            "checked_candidates_mean": sum(r["checked_candidates"] for r in rows) / len(rows),
            "checked_all_failed": sum(r["checked_agreed"] == 0 for r in rows),
            "checked_ready_at_enter_rate": sum(bool(r.get("checked_ready_at_enter")) for r in rows) / len(rows)}


def vs_peer(stats: dict, peer_total_p50_ms: float) -> None:
    """The checked answer's p50 against the peer's greedy complete answer (`checked_p50_vs_llamacpp`)."""
    if "checked_p50_ms" in stats:
        stats["checked_p50_vs_llamacpp"] = stats["checked_p50_ms"] / peer_total_p50_ms


HEADER = ["checked p50 ms", "checked p99 ms", "checked p50/greedy complete", "candidates checked (mean)",
          "choice changed", "all candidates done at Enter", "checked p50/llamacpp complete"]


def table_cells(stats: dict) -> list:
    if "checked_p50_ms" not in stats:
        return []
    peer = stats.get("checked_p50_vs_llamacpp")
    return [stats["checked_p50_ms"], stats["checked_p99_ms"], f"{stats['checked_p50_vs_greedy_complete']:.2f}",
            f"{stats['checked_candidates_mean']:.1f}", f"{stats['checked_changed_rate']:.0%}",
            f"{stats['checked_ready_at_enter_rate']:.0%}", "-" if peer is None else f"{peer:.3f}"]
