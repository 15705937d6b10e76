"""Execution-checked answers on a replica: candidates from the wire, the `Choice` after the Result.

A submit or completion asking `CandidatesRequest(k > 1)` is the greedy
answer of a candidate set (`headstart.engine.requests.candidates`). Its
tokens and Result stream as any answer's; then `answer_events` awaits the
check (`headstart.candidates.CheckedAnswers`: the candidates' SQL run
read-only on the request's database, on threads of its own, never the
forward worker's nor the event loop's) and sends one `Choice` event.

The Run limits are the gateway's (`CheckLimits`, what `/v1/execute` allows:
deadline, rows shown, cell length), so a checked answer costs what a Run
click would; a replica keeps one `CheckedAnswers` per limits in use.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Callable

from headstart.candidates import CandidateLimits, CheckedAnswers, CheckedChoice
from headstart.candidates.runner import TRUNCATED_MARK
from headstart.config import EngineSettings
from headstart.engine.requests.candidates import CandidateParams
from headstart.engine.requests.generation import GenerationRequest
from headstart.v1 import engine_pb2, types_pb2
from services.engine import events
from services.engine.generate import generation_events

MAX_LIMIT_SETS = 4  # distinct CheckLimits kept (gateways of one deployment send one)


def candidates_of(wire: types_pb2.CandidatesRequest, settings: EngineSettings) -> CandidateParams | None:
    """The candidates a request asks for; None when it leaves them to the default (k 0).

    `wait_all` is left False here (the checker takes it per request), so a
    submit asking the session's own candidates gets the set its pause decoded.

    Raises:
        InvalidInput: k or temperature out of range.
    """
    if wire.k == 0:
        return None
    temperature = wire.temperature if wire.HasField("temperature") else settings.candidate_temperature
    params = CandidateParams(wire.k, temperature, settings.candidate_top_p, wire.seed,
                             length_slack=settings.candidate_length_slack)
    params.validate()
    return params


def limits_of(wire: engine_pb2.CheckLimits) -> CandidateLimits:
    """The Run limits a gateway sent (0: the default of each)."""
    default = CandidateLimits()
    return CandidateLimits(timeout_s=wire.timeout_s or default.timeout_s, row_limit=default.row_limit,
                           display_rows=wire.rows or default.display_rows,
                           cell_chars=wire.cell_chars or default.cell_chars)


def choice_message(choice: CheckedChoice, seq: int) -> types_pb2.Choice:
    """The wire `Choice` of a checked answer: the chosen SQL, its first rows, the agreement."""
    chosen = next((o for o in choice.outcomes if o.index == choice.index), None)
    num_rows = chosen.num_rows if chosen is not None and chosen.ok else 0
    cut = any(isinstance(v, str) and v.endswith(TRUNCATED_MARK) for row in choice.rows for v in row)
    failed = [types_pb2.FailedCandidate(index=o.index, error=o.error or o.error_code or "failed")
              for o in choice.outcomes if not o.ok]
    return types_pb2.Choice(
        seq=seq, index=choice.index, sql=choice.sql, columns=list(choice.columns),
        rows_json=json.dumps([list(row) for row in choice.rows], ensure_ascii=False),
        truncated=cut or num_rows > len(choice.rows), agreed=choice.agreed, num_candidates=choice.num_candidates,
        failed=failed, error=choice.error or "", num_rows=num_rows)


class ReplicaChecks:
    """A replica's checkers (one `CheckedAnswers` per Run limits in use); `close` at shutdown."""

    def __init__(self, spider_dir=None):
        self.spider_dir = spider_dir
        self._by_limits: OrderedDict[CandidateLimits, CheckedAnswers] = OrderedDict()
        self._lock = threading.Lock()

    def checker(self, limits: CandidateLimits) -> CheckedAnswers:
        with self._lock:
            answers = self._by_limits.pop(limits, None) or CheckedAnswers(self.spider_dir, limits)
            self._by_limits[limits] = answers
            old = self._by_limits.popitem(last=False)[1] if len(self._by_limits) > MAX_LIMIT_SETS else None
        if old is not None:
            old.close()
        return answers

    async def choice_event(self, spec: str, request: GenerationRequest, wire_limits: engine_pb2.CheckLimits,
                           wait_all: bool, seq: int) -> engine_pb2.EngineEvent:
        """The `Choice` event of `request` (its candidate set checked on database `spec`), or the
        Error event of a check that could not run (a database without a SQLite file)."""
        try:
            answers = self.checker(limits_of(wire_limits))
            # resolving the database reads its file: off the loop, as the waiting and the SQL
            future = await asyncio.to_thread(answers.check, spec, request, wait_all)
            choice = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return events.from_exception(exc, seq)
        return engine_pb2.EngineEvent(choice=choice_message(choice, seq))

    def close(self) -> None:
        with self._lock:
            answers, self._by_limits = list(self._by_limits.values()), OrderedDict()
        for a in answers:
            a.close()


async def answer_events(request: GenerationRequest, decode: Callable[[list[int]], str], replica: str, seq: int,
                        checks: ReplicaChecks, spec: str, limits: engine_pb2.CheckLimits,
                        wait_all: bool) -> AsyncIterator[engine_pb2.EngineEvent]:
    """An answer's events: its tokens and Result (`generation_events`), then, when it decoded
    candidates, its `Choice` (or the check's Error)."""
    ended = False
    try:
        async for event in generation_events(request, decode, replica, seq):
            ended = event.WhichOneof("kind") == "result"
            yield event
        if ended and request.candidates is not None:
            yield await checks.choice_event(spec, request, limits, wait_all, seq)
    finally:
        if request.candidates is not None:  # chosen (or nobody waits): the unfinished ones are waste
            request.candidates.cancel()
