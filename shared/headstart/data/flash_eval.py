"""Flash evaluation: registered questions answered on one data version (paper §3.9.3).

`evaluate` runs one job at FLASH priority (ahead of every other class: a new
data version's answers are what subscribers wait for). Its first step takes
one `Snapshot` of the live cache; every question is then answered on that
snapshot, one after the other, each extending its own share and dropping
it when done (the paper's extend, decode, crop back, with the live cache
never written). Rows that arrive meanwhile are ingested into the live cache
after the job, so every answer of one call names the same version.

Each answer's SQL is then executed read-only on the working copy at that
version (`WorkingCopy.execute`), on the caller's thread: the worker is not
held by SQLite.

Exactness: an `Answer` is the same mechanism `DataSession.query` uses, so a
flash answer's tokens equal a query's on the same version (and a cold
prefill's, with `rebuild` retention).
"""

from __future__ import annotations

import time

from headstart.data.answer import Answer, Snapshot, logit_gap
from headstart.data.states import DataState
from headstart.data.types import FlashAnswer
from headstart.data.workcopy import SqlError
from headstart.engine.errors import InvalidInput, SessionClosed
from headstart.engine.runner.rows import Row, RowResult
from headstart.engine.sched.jobs import JobWork, Priority
from headstart.eval.extract import extract_sql

MAX_QUESTIONS = 256  # one call's questions at most (the registry's bound is lower)


def evaluate(session, questions: list[str], max_new_tokens: int = 64,
             timeout: float | None = None) -> list[FlashAnswer]:
    """Answer `questions` on one snapshot of `session`'s live cache (module doc).

    Returns one `FlashAnswer` per question, in order; all carry the same
    version. An empty list returns [] without touching the model.

    Raises:
        InvalidInput: a question is empty or too long, max_new_tokens < 1, or too many questions.
        SessionClosed: the session closed before or during the evaluation.
        TimeoutError: not done in `timeout` s (the job stops at its next step).
    """
    if not isinstance(questions, (list, tuple)):
        raise InvalidInput("questions must be a list of strings")
    if len(questions) > MAX_QUESTIONS:
        raise InvalidInput(f"{len(questions)} questions; one evaluation takes at most {MAX_QUESTIONS}")
    checked = [session._check_question(q, max_new_tokens) for q in questions]
    if not checked:
        return []
    answers = [Answer(session.runner, session.prompt.question_ids(q), max_new_tokens, session.runtime.stop_ids)
               for q in checked]
    run = _Run(session, answers)
    with session._lock:
        session._answers.update(answers)
    job = session._enqueue(run, Priority.FLASH, "data-flash")
    try:
        job.wait(timeout)
    except TimeoutError:
        run.cancelled = True
        raise
    finally:
        with session._lock:
            session._answers.difference_update(answers)
            session.counts["flash_evaluations"] += 1
            session.counts["flash_questions"] += len(answers)
    return [_finish(session, question, answer, run.snapshot, seconds)
            for question, answer, seconds in zip(checked, answers, run.seconds)]


class _Run(JobWork):
    """The job: the snapshot, which answer is running, each one's model time."""

    def __init__(self, session, answers: list[Answer]):
        self.session, self.answers = session, answers
        self.snapshot: Snapshot | None = None
        self.index, self.cancelled = 0, False
        self.seconds = [0.0] * len(answers)
        self._started = 0.0  # when the running answer's row was prepared

    def step(self) -> Row | bool:
        if self.session.state is DataState.CLOSED:
            raise SessionClosed(f"data session {self.session.id} is closed")
        if self.cancelled:
            return False
        if self.snapshot is None:
            self.snapshot = self.session._snapshot()
        while self.index < len(self.answers) and self.answers[self.index].done:
            self.index += 1
        if self.index == len(self.answers):
            return False
        index = self.index
        answer = self.answers[index]
        if answer.kv is None:
            answer.start(self.snapshot)
        self._started = time.perf_counter()
        return answer.row()

    def commit(self, row: Row, result: RowResult) -> bool:
        """The running answer's commit (it picks the token, says if it goes on), timed."""
        index = self.index
        more = self.answers[index].commit(row, result)
        self.seconds[index] += time.perf_counter() - self._started
        return more or index + 1 < len(self.answers)


def _finish(session, question: str, answer: Answer, snapshot: Snapshot, seconds: float) -> FlashAnswer:
    """The answer's text and SQL, and the SQL run on the working copy at the snapshot's version."""
    started = time.perf_counter()
    text = session.prompt.decode(answer.tokens)
    sql = extract_sql(text)
    columns, rows, error = [], [], None
    if not sql.strip():
        error = "the answer holds no SQL"
    else:
        try:
            columns, rows = session.execute(sql, snapshot.version)
        except SqlError as exc:
            error = exc.message
        columns, rows = list(columns), [tuple(r) for r in rows]
    return FlashAnswer(question, snapshot.version, text, sql, columns, rows, error,
                       logit_gap(answer.first_logits), seconds + time.perf_counter() - started, list(answer.tokens))
