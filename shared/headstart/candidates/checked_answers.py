"""The checked answer of a request: wait for its candidates, run their SQL, choose.

`CheckedAnswers.check(db, request)` returns a `Future[CheckedChoice]`. The
waiting and the SQL run on threads of their own (the runner's,
`runner.CandidateRunner`), never on the forward worker's: a slow query
delays the choice, never a forward. Without `wait_all` the choice is made
among the greedy answer and the candidates ready when it ends (a submit
never waits for more); with it, among all K once they end.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from headstart.candidates.choice import choose
from headstart.candidates.records import Candidate, CheckedChoice
from headstart.candidates.runner import CandidateLimits, CandidateRunner
from headstart.engine.errors import InvalidInput
from headstart.engine.requests.candidates import CandidateAnswer

WAITERS = 4  # requests whose candidates are awaited at once


class CheckedAnswers:
    """Checks requests' candidates on their databases (one per runtime; `close` when done).

    Args:
        spider_dir: where Spider ids resolve (the runtime's `settings.spider_dir`).
    """

    def __init__(self, spider_dir: str | Path | None = None, limits: CandidateLimits | None = None):
        self.spider_dir = spider_dir
        self.runner = CandidateRunner(limits)
        self._waiters = concurrent.futures.ThreadPoolExecutor(WAITERS, thread_name_prefix="candidate-wait")
        self._paths: dict[str, Path] = {}

    def sqlite_path(self, db: str) -> Path:
        """The SQLite file of `db` (a Spider id or a path); InvalidInput for a database
        whose candidates cannot be run here (PostgreSQL, a Spider id without its file)."""
        if db not in self._paths:
            from headstart.schema.resolve import resolve_database

            resolved = resolve_database(db, spider_dir=self.spider_dir)
            if resolved.sqlite_path is None:
                raise InvalidInput(f"candidates are checked on SQLite databases; {db!r} has no SQLite file")
            self._paths[db] = resolved.sqlite_path
        return self._paths[db]

    def check(self, db: str, request, wait_all: bool | None = None) -> "concurrent.futures.Future[CheckedChoice]":
        """The checked choice among `request`'s candidates (a `GenerationRequest`; one without
        candidates is checked alone). `wait_all` None: the set's `CandidateParams.wait_all`."""
        path = self.sqlite_path(db)
        cset = request.candidates
        wait_all = cset is not None and (cset.params.wait_all if wait_all is None else wait_all)

        def checked() -> CheckedChoice:
            request.done.wait()
            if cset is None:
                text = "" if request.error is not None else request.result().text
                answers = [CandidateAnswer(0, text, tuple(request.token_ids),
                                           "error" if request.error is not None else request.finish_reason)]
            else:
                cset.wait(all_candidates=wait_all)
                answers = cset.candidates()
            return choose(self.runner.run(path, [Candidate.of(a) for a in answers]))

        return self._waiters.submit(checked)

    def close(self) -> None:
        self._waiters.shutdown(wait=False, cancel_futures=True)
        self.runner.close()
