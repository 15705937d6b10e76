"""The evaluation loop: for each question, generate, extract, execute both, compare.

Questions are handled one at a time in dataset order. A skipped question (its
database is missing) is recorded, not executed. The gold SQL runs first; if it
fails the question is recorded as `gold_error` and left out of the accuracy
(the report counts them). A generator that raises on one question does not
end the run: the row records the error and counts as wrong.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping

from headstart.eval.checked import checked_of, outcome_entry, score_candidates
from headstart.eval.compare import ResultComparator
from headstart.eval.exact_match import exact_match
from headstart.eval.executors.base import Executor
from headstart.eval.extract import extract_sql
from headstart.eval.generators import SqlGenerator
from headstart.eval.records import (
    STATUS_GOLD_ERROR,
    STATUS_SCORED,
    STATUS_SKIPPED,
    EvalQuestion,
    QuestionResult,
)

GENERATION_ERROR = "generation_error"


def run_eval(
    questions: Iterable[EvalQuestion],
    generator: SqlGenerator,
    executor: Executor,
    rule: ResultComparator,
    *,
    on_row: Callable[[QuestionResult], None] | None = None,
    done: Mapping[int, QuestionResult] | None = None,
) -> list[QuestionResult]:
    """Score every question; `on_row` is called after each new row (progress, the row log).

    `done` holds rows a resumed run already has, by dataset index: they are
    returned in their place and not generated again.
    """
    questions = list(questions)
    done = done or {}
    first = next((q for q in questions if not q.skipped and q.index not in done), None)
    if first is not None:
        generator.warmup(first)
    rows = []
    for question in questions:
        if question.index in done:
            rows.append(done[question.index])
            continue
        row = score_question(question, generator, executor, rule)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def score_question(
    question: EvalQuestion, generator: SqlGenerator, executor: Executor, rule: ResultComparator
) -> QuestionResult:
    """One question, end to end; see the module docstring for the statuses."""
    row = QuestionResult(
        index=question.index,
        question_id=question.question_id,
        db_id=question.db_id,
        question=question.question,
        gold_sql=question.gold_sql,
        status=STATUS_SKIPPED,
        skip_reason=question.skip_reason,
    )
    if question.skipped or question.db_path is None:
        return row
    gold_sql = rule.prepare_gold(question.gold_sql)
    gold = executor.execute(question.db_id, question.db_path, gold_sql)
    if not gold.ok:
        row.status, row.gold_error = STATUS_GOLD_ERROR, f"{gold.error_code}: {gold.error}"
        return row
    row.status = STATUS_SCORED
    started = time.perf_counter()
    try:
        generation = generator.generate(question)
    except Exception as exc:  # noqa: BLE001 - one failed question must not end an hours-long run
        row.gen_ms = (time.perf_counter() - started) * 1000.0
        row.correct, row.exact = False, False
        row.pred_error_code, row.pred_error = GENERATION_ERROR, f"{type(exc).__name__}: {exc}"
        return row
    row.gen_ms = (time.perf_counter() - started) * 1000.0
    row.pred_text, row.ttft_ms, row.extra = generation.text, generation.ttft_ms, dict(generation.extra)
    row.pred_sql = extract_sql(generation.text)
    pred_sql = rule.prepare_pred(row.pred_sql)
    if pred_sql != row.pred_sql:  # the rule set rewrote it (spider-official): show what ran
        row.extra["executed_pred_sql"] = pred_sql
    pred = executor.execute(question.db_id, question.db_path, pred_sql)
    row.pred_error_code, row.pred_error = pred.error_code, pred.error
    row.correct = bool(pred.ok and gold.result is not None and pred.result is not None
                       and rule.equal(gold.result, pred.result, gold_sql))
    row.exact = exact_match(question.gold_sql, row.pred_sql, executor.known_names(question.db_id, question.db_path))
    answers = row.extra.get("candidate_answers")
    if answers is not None:  # --candidates: each one run and scored, then the vote
        greedy = outcome_entry(0, row.pred_sql, pred, row.correct)
        row.extra["candidates"] = score_candidates(question, answers, greedy, gold, gold_sql, executor, rule)
        row.extra["checked"] = checked_of(row.extra["candidates"])
    return row
