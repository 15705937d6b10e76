"""Execution-checked EX: each candidate's SQL run and scored, the vote's choice, greedy vs checked.

A run with `--candidates K` records, per question, the sampled candidates'
answers (`extra.candidate_answers`, from the generator) and here each
candidate's scored outcome (`extra.candidates`: index, SQL, result key,
error code, correct), so the checked answer of any k <= K is computed from
the row log alone (candidate i is seeded `seed + i`: K's first k are k's):
`checked_of(candidates, k)` applies the vote (`candidate_vote`) to the
first k, and `checked_summary(rows, k)` puts greedy and checked EX side by
side on the same questions with the paired lost/gained and McNemar's p.
"""

from __future__ import annotations

from typing import Any, Sequence

from headstart.eval.candidate_vote import winning_key
from headstart.eval.compare import ResultComparator
from headstart.eval.executors.base import Executor
from headstart.eval.extract import extract_sql
from headstart.eval.records import STATUS_SCORED, EvalQuestion, ExecOutcome, QuestionResult
from headstart.eval.result_key import result_key
from headstart.eval.stats import paired_comparison, wilson_interval


def not_run(finish_reason: str | None) -> tuple[str, str] | None:
    """(error code, error) of a candidate whose SQL is not run, by its finish reason; None: run it.
    A bounded one was cut inside its SQL: running a prefix of a query proves nothing."""
    if finish_reason in ("error", "cancelled"):
        return "not_finished", f"the candidate ended {finish_reason}"
    if finish_reason == "bounded":
        return "bounded", "the candidate ran past the greedy answer's length + its slack"
    return None


def outcome_entry(index: int, sql: str, out: ExecOutcome, correct: bool) -> dict[str, Any]:
    """One candidate's scored outcome as the row log keeps it."""
    return {"index": index, "sql": sql, "key": result_key(out.result) if out.ok and out.result is not None else None,
            "error_code": out.error_code, "correct": bool(correct)}


def score_candidates(question: EvalQuestion, answers: Sequence[dict[str, Any]], greedy: dict[str, Any],
                     gold: ExecOutcome, gold_sql: str, executor: Executor, rule: ResultComparator) -> list[dict]:
    """Every candidate's outcome, the greedy one (`greedy`, already scored) first."""
    entries = [greedy]
    for answer in sorted(answers, key=lambda a: a["index"]):
        sql = extract_sql(answer.get("text", ""))
        skipped = not_run(answer.get("finish_reason"))
        if skipped is not None:
            entries.append({"index": answer["index"], "sql": sql, "key": None, "correct": False,
                            "error_code": skipped[0]})
            continue
        out = executor.execute(question.db_id, question.db_path, rule.prepare_pred(sql))
        correct = bool(out.ok and gold.result is not None and out.result is not None
                       and rule.equal(gold.result, out.result, gold_sql))
        entries.append(outcome_entry(answer["index"], sql, out, correct))
    return entries


def checked_of(candidates: Sequence[dict[str, Any]], k: int | None = None) -> dict[str, Any]:
    """The vote over the first `k` candidates (all: None): the chosen index, whether it is
    correct, how many agreed, which failed. With every one failed, the greedy answer stands."""
    pool = sorted((c for c in candidates if k is None or c["index"] < k), key=lambda c: c["index"])
    key = winning_key([c["key"] for c in pool])
    chosen = next((c for c in pool if c["key"] == key), pool[0]) if key is not None else pool[0]
    return {"k": len(pool), "index": chosen["index"], "correct": bool(chosen["correct"]),
            "agreed": sum(c["key"] == key for c in pool) if key is not None else 0,
            "failed": [c["index"] for c in pool if c["key"] is None],
            "any_correct": any(c["correct"] for c in pool)}


def candidates_in(rows: Sequence[QuestionResult]) -> int:
    """The most candidates any scored row holds (1: a run without candidates)."""
    return max((len(r.extra.get("candidates") or ()) for r in rows if r.status == STATUS_SCORED), default=1) or 1


def checked_summary(rows: Sequence[QuestionResult], k: int | None = None) -> dict[str, Any] | None:
    """Greedy vs checked EX over the rows with candidates (None when there are none)."""
    scored = [r for r in rows if r.status == STATUS_SCORED and r.extra.get("candidates")]
    if not scored:
        return None
    k = k or candidates_in(rows)
    checked = {r.index: checked_of(r.extra["candidates"], k) for r in scored}
    greedy_right = {r.index: bool(r.correct) for r in scored}
    checked_right = {i: c["correct"] for i, c in checked.items()}
    g, c = wilson_interval(sum(greedy_right.values()), len(scored)), wilson_interval(sum(checked_right.values()), len(scored))
    o = wilson_interval(sum(v["any_correct"] for v in checked.values()), len(scored))
    pair = paired_comparison(greedy_right, checked_right)
    return {
        "k": k, "n": len(scored),
        "greedy_correct": g.k, "greedy_execution_accuracy": g.rate, "greedy_ci95": [g.lo, g.hi],
        "checked_correct": c.k, "checked_execution_accuracy": c.rate, "checked_ci95": [c.lo, c.hi],
        "lost": pair.right_to_wrong, "gained": pair.wrong_to_right, "mcnemar_p": pair.p_value,
        "changed": sum(v["index"] != 0 for v in checked.values()),
        "all_failed": sum(v["agreed"] == 0 for v in checked.values()),
        "oracle_correct": o.k, "oracle_execution_accuracy": o.rate,
    }


CHECKED_HEADER = ("| K | n | greedy EX [95% CI] | checked EX [95% CI] | lost | gained | McNemar p | "
                  "choice changed | all failed | any candidate right |")
CHECKED_RULE = "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"


def checked_row(s: dict[str, Any]) -> str:
    def pct(rate, ci=None):
        text = f"{100 * rate:.1f}%"
        return text + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")

    return (f"| {s['k']} | {s['n']} | {pct(s['greedy_execution_accuracy'], s['greedy_ci95'])} | "
            f"{pct(s['checked_execution_accuracy'], s['checked_ci95'])} | {s['lost']} | {s['gained']} | "
            f"{s['mcnemar_p']:.2g} | {s['changed']} | {s['all_failed']} | {pct(s['oracle_execution_accuracy'])} |")
