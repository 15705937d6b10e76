"""Who answers a session's flash questions: the interface and its two variants.

The worker asks an `Evaluator` to answer all the questions of one session on
one snapshot of its live cache. `GrpcEvaluator` calls the owning replica's
`Engine.DataEvaluate` (the deployment); `LocalEvaluator` calls
`DataSession.evaluate` in this process (tests, a one-process stack). Both
return the same `Evaluation`, so the worker's logic is tested once with
either.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc

from headstart.data.live_store import VersionEntry
from headstart.engine.errors import HeadstartError
from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.guard import SECRET_METADATA_KEY, TENANT_METADATA_KEY

ANSWER_FIELDS = ("question", "version", "text", "sql", "columns", "rows", "error", "logit_gap", "ms")


@dataclass(frozen=True)
class Evaluation:
    """Answers of one evaluation, all on one data `version`, in the order of the
    questions asked. Each answer is a dict with `ANSWER_FIELDS`."""

    version: int
    answers: list[dict]


class EvaluatorRetry(Exception):
    """Try this entry again later: the replica does not hold the session (until the
    gateway reopens it) or cannot be reached."""


class EvaluatorFailed(Exception):
    """The questions cannot be answered (a bad question, an internal error): do not retry."""


class Evaluator(Protocol):
    """Answers a session's flash questions at FLASH priority, in place on its live cache.

    `evaluate` is called by the worker once per version entry that still has
    unanswered questions, with those questions in registration order. It
    returns answers on the live cache's version at the time (>= the entry's
    when the replica is current). Raises `EvaluatorRetry` or `EvaluatorFailed`.
    """

    def evaluate(self, entry: VersionEntry, questions: list[str], max_new_tokens: int) -> Evaluation: ...

    def close(self) -> None: ...


def _flash_answer_dict(answer) -> dict:
    """A `headstart.data` FlashAnswer as the dict the live store keeps (rows as the wire has them)."""
    # imported here: the replica's wire module loads torch, which only an in-process evaluator has anyway
    from services.engine.data_wire import rows_json

    return {"question": answer.question, "version": int(answer.version), "text": answer.text, "sql": answer.sql,
            "columns": list(answer.columns), "rows": json.loads(rows_json(answer.rows)), "error": answer.error or "",
            "logit_gap": float(answer.logit_gap), "ms": float(answer.seconds) * 1000.0}


class LocalEvaluator:
    """Evaluates on `DataSession`s of this process, found by their engine session id.

    Args:
        sessions: session id -> DataSession, or a callable returning one (None: not held).
    """

    def __init__(self, sessions: Mapping | Callable[[str], object | None]):
        self._find = sessions if callable(sessions) else sessions.get

    def evaluate(self, entry: VersionEntry, questions: list[str], max_new_tokens: int) -> Evaluation:
        session = self._find(entry.session_id)
        if session is None:
            raise EvaluatorRetry(f"data session {entry.session_id} is not held here")
        try:
            answers = session.evaluate(questions, max_new_tokens=max_new_tokens)
        except HeadstartError as exc:
            raise EvaluatorFailed(f"{exc.code}: {exc.message}") from exc
        if len(answers) != len(questions):
            raise EvaluatorFailed(f"{len(answers)} answers to {len(questions)} questions")
        dicts = [_flash_answer_dict(a) for a in answers]
        return Evaluation(version=dicts[0]["version"] if dicts else 0, answers=dicts)

    def close(self) -> None:
        pass


# Statuses after which the same call may succeed later (NOT_FOUND: the gateway reopens
# the session on the replica the ring picks; the others: a replica restarting).
_RETRY_CODES = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}


def answer_from_wire(answer: engine_pb2.DataAnswer) -> dict:
    """A `DataAnswer` message as the dict the live store keeps."""
    return {"question": answer.question, "version": int(answer.version), "text": answer.text, "sql": answer.sql,
            "columns": list(answer.columns), "rows": json.loads(answer.rows_json) if answer.rows_json else [],
            "error": answer.error, "logit_gap": answer.logit_gap, "ms": answer.ms}


class GrpcEvaluator:
    """Calls `Engine.DataEvaluate` through Serve's gRPC proxy, like the gateway's calls:
    `session_id` metadata (the sticky router sends it to the owning replica), the
    engine secret and the session's tenant.

    Args:
        target: host:port of the engine (Serve's gRPC proxy).
        app_name: Serve application name of the engine ("application" metadata).
        secret: the engine secret (services/engine/guard.py).
        timeout_s: deadline of one evaluation.
    """

    def __init__(self, target: str, app_name: str, secret: str, timeout_s: float = 60.0):
        self.target, self.timeout_s = target, timeout_s
        self._channel = grpc.insecure_channel(target)
        self._stub = engine_pb2_grpc.EngineStub(self._channel)
        self._metadata = (("application", app_name), (SECRET_METADATA_KEY, secret))

    def evaluate(self, entry: VersionEntry, questions: list[str], max_new_tokens: int) -> Evaluation:
        metadata = (*self._metadata, ("session_id", entry.session_id), (TENANT_METADATA_KEY, entry.tenant))
        request = engine_pb2.DataEvaluateRequest(session_id=entry.session_id, questions=questions,
                                                 max_new_tokens=max_new_tokens)
        try:
            reply = self._stub.DataEvaluate(request, metadata=metadata, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            message = f"DataEvaluate {entry.session_id}: {exc.code().name} {exc.details()}"
            raise (EvaluatorRetry if exc.code() in _RETRY_CODES else EvaluatorFailed)(message) from exc
        if len(reply.answers) != len(questions):
            raise EvaluatorFailed(f"{len(reply.answers)} answers to {len(questions)} questions")
        return Evaluation(version=int(reply.version), answers=[answer_from_wire(a) for a in reply.answers])

    def close(self) -> None:
        self._channel.close()
