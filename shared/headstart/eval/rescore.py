"""Score a finished run again under other rules, without generating anything again.

A Spider run takes an hour of model time; its answers do not depend on the
rule set that scores them. `rescore_command(run, rules, out)` replays the
run's recorded answers (`RecordedGenerator`: each question's raw answer
text, TTFT and details as generated) through the same harness with another
rule set, on the same questions (re-loaded from the run's own config), and
writes a new run folder whose config says where its answers came from.
With `candidates=k`, a run made with `--candidates K` (k <= K) is scored
as if it had decoded k: candidate i is seeded `seed + i`, so K's first k
are exactly what `--candidates k` decodes. With `length_slack=s`, each
sampled candidate is bounded as the engine bounds it
(`CandidateSet.bound`): once the greedy answer has stopped after L tokens,
one of L + s tokens or more ends "bounded" and is not run. The rule reads
only token counts, which the run recorded, so the replay is the choice a
run with that slack makes (its recorded text stays uncut). A run recorded
with a slack takes only a tighter one.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from headstart.eval.checked import checked_summary
from headstart.eval.compare import get_rule
from headstart.eval.dataset import load_dataset, seeded_subset
from headstart.eval.errors import DatasetError
from headstart.eval.executors import ExecLimits, build_executor
from headstart.eval.harness import run_eval
from headstart.eval.records import EvalQuestion, Generation
from headstart.eval.report import load_run, write_run
from headstart.eval.summary import summarize


class RecordedGenerator:
    """Answers with what a finished run generated for each question (by question id)."""

    def __init__(self, run: dict[str, Any], candidates: int | None = None, length_slack: int | None = None):
        self.mode = run["config"].get("mode", "recorded")
        self._answers = {q["question_id"]: q for q in run["questions"] if q.get("status") != "skipped"}
        self.candidates = candidates  # keep the first k candidates (None: all recorded)
        self.length_slack = length_slack  # bound the sampled candidates (None: as recorded)
        if candidates is not None:
            recorded = run["config"].get("candidates", 1)
            if not 1 <= candidates <= recorded:
                raise DatasetError(f"--candidates {candidates}: the run decoded {recorded} (rescore takes 1..{recorded})")
        if length_slack is not None:
            recorded = run["config"].get("candidate_length_slack")
            if length_slack < 0 or (recorded is not None and length_slack > recorded):
                raise DatasetError(f"--candidate-length-slack {length_slack}: the run bounded its candidates at "
                                   f"{recorded} tokens of slack (rescore takes 0..{recorded})" if recorded is not None
                                   else f"--candidate-length-slack {length_slack}: a slack is 0 or more tokens")

    def warmup(self, question: EvalQuestion) -> None:
        return None

    def generate(self, question: EvalQuestion) -> Generation:
        recorded = self._answers.get(question.question_id)
        if recorded is None:
            raise DatasetError(f"the run has no answer for question {question.question_id}")
        extra = {k: v for k, v in (recorded.get("extra") or {}).items() if k not in ("candidates", "checked")}
        if self.candidates is not None:
            answers = [a for a in extra.get("candidate_answers", []) if a["index"] < self.candidates]
            extra.pop("candidate_answers", None)
            if self.candidates > 1:
                extra["candidate_answers"] = answers
        if self.length_slack is not None and extra.get("candidate_answers"):
            extra["candidate_answers"] = bounded(extra["candidate_answers"], extra, self.length_slack)
        return Generation(text=recorded.get("pred_text", ""), ttft_ms=recorded.get("ttft_ms"), extra=extra)

    def close(self) -> None:
        return None


def bounded(answers: list[dict[str, Any]], greedy: dict[str, Any], slack: int) -> list[dict[str, Any]]:
    """`answers` as a run bounding its sampled candidates at the greedy answer's length +
    `slack` decodes them (`greedy`: the greedy answer's recorded details)."""
    if greedy.get("finish_reason") != "stop" or greedy.get("num_tokens") is None:
        return answers  # the greedy answer did not stop: no bound
    bound = int(greedy["num_tokens"]) + slack
    return [{**a, "finish_reason": "bounded"}
            if a.get("finish_reason") in ("stop", "length") and int(a.get("num_tokens", 0)) >= bound else a
            for a in answers]


def rescore_command(run: Path, rules: str, out: Path, candidates: int | None = None,
                    length_slack: int | None = None) -> dict[str, Any]:
    """The run at `run` scored under `rules` (and with its first `candidates` candidates,
    bounded at `length_slack`), written under `out`; returns the summary."""
    rule = get_rule(rules)
    data = load_run(Path(run))
    config = dict(data["config"])
    if config.get("executor", "sqlite") != "sqlite":
        raise DatasetError("rescore replays SQLite runs only (a PostgreSQL run needs its migrated schemas)")
    dataset = load_dataset(config.get("dataset", "spider-dev"),
                           db_dir=Path(config["db_dir"]) if config.get("db_dir") else None,
                           dbs=config.get("dbs"), limit=config.get("limit"))
    if config.get("sample"):
        dataset = seeded_subset(dataset, config["sample"], config.get("sample_seed") or 0)
    limits = ExecLimits(timeout_s=config.get("timeout_s", 30.0), row_limit=config.get("row_limit", 100_000))
    started = time.perf_counter()
    with ExitStack() as stack:
        runner = build_executor("sqlite", limits)
        stack.callback(runner.close)
        rows = run_eval(dataset.questions, RecordedGenerator(data, candidates, length_slack), runner, rule)
    summary = summarize(rows)
    checked = checked_summary(rows)
    if checked is not None:
        summary["checked"] = checked
    config.update(rules=rules, rescored_from=str(run), rescore_s=round(time.perf_counter() - started, 3))
    if candidates is not None:
        config["candidates"] = candidates
    if length_slack is not None:
        config["candidate_length_slack"] = length_slack
    write_run(Path(out), config, summary, rows)
    return {**summary, "config": config}
