"""A counting evaluator for the flash worker's logic tests, and a worker process to kill.

`CountingEvaluator` answers like a replica exactly at the entry's version
(or, with `live=True`, at the session's current version, as a live cache
that moved on) and counts every evaluation per (session, version) in Redis,
where the count survives a killed process.

`CountingGrpc` counts the evaluations of a real `GrpcEvaluator` the same way.

`python -m tests.flash_fakes URL PREFIX CONSUMER [--crash-at STAGE:VERSION[:SID]]
[--engine TARGET --app APP]` runs a worker that drains the versions stream and
exits 0; with --crash-at it SIGKILLs itself at that stage ("evaluated": between
evaluate and store, "stored": between store and ack) of the entry of that
version (of that session). With --engine it evaluates on a real engine
(secret from $HEADSTART_ENGINE_SECRET), else with `CountingEvaluator`.
"""

from __future__ import annotations

import argparse
import os
import signal

from headstart.data.live_store import LiveStore, VersionEntry
from services.flash.evaluator import Evaluation, EvaluatorRetry
from services.flash.worker import FlashWorker, WorkerConfig


def evals_key(store: LiveStore) -> str:
    return f"{store.prefix}:test:evaluations"


class CountingEvaluator:
    """Answers `SELECT <version>` for every question; counts evaluations in Redis."""

    def __init__(self, store: LiveStore, live: bool = False, not_held: set[str] = frozenset()):
        self.store, self.live, self.not_held = store, live, set(not_held)

    def evaluate(self, entry: VersionEntry, questions: list[str], max_new_tokens: int) -> Evaluation:
        if entry.session_id in self.not_held:
            raise EvaluatorRetry("data session not on this replica")
        version = self.store.current_version(entry.session_id) if self.live else entry.version
        self.store.client.hincrby(evals_key(self.store), f"{entry.session_id}:{version}", 1)
        answers = [{"question": q, "version": version, "text": f"SELECT {version}", "sql": f"SELECT {version}",
                    "columns": ["v"], "rows": [[version]], "error": "", "logit_gap": 1.5, "ms": 1.0}
                   for q in questions]
        return Evaluation(version, answers)

    def close(self) -> None:
        pass


class CountingGrpc:
    """A real evaluator whose successful evaluations are counted per (session, answered version)."""

    def __init__(self, store: LiveStore, inner):
        self.store, self.inner = store, inner

    def evaluate(self, entry: VersionEntry, questions: list[str], max_new_tokens: int) -> Evaluation:
        evaluation = self.inner.evaluate(entry, questions, max_new_tokens)
        self.store.client.hincrby(evals_key(self.store), f"{entry.session_id}:{evaluation.version}", 1)
        return evaluation

    def close(self) -> None:
        self.inner.close()


def evaluations(store: LiveStore) -> dict[str, int]:
    """(session:version) -> evaluations, over every process that ran."""
    return {k.decode(): int(v) for k, v in store.client.hgetall(evals_key(store)).items()}


def drain(worker: FlashWorker) -> None:
    """Recover, then handle entries until none is new or pending."""
    worker.recover()
    while worker.step() or worker.store.num_pending_versions():
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("consumer")
    parser.add_argument("--crash-at", default="")
    parser.add_argument("--engine", default="")
    parser.add_argument("--app", default="headstart-engine")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    store = LiveStore(args.url, prefix=args.prefix)
    crash_stage, crash_version, crash_sid = (args.crash_at.split(":") + ["", "", ""])[:3]

    def hook(stage: str, entry: VersionEntry) -> None:
        if stage == crash_stage and entry.version == int(crash_version) and crash_sid in ("", entry.session_id):
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no ack: as a crash

    if args.engine:
        from services.engine.guard import configured_secret
        from services.flash.evaluator import GrpcEvaluator

        evaluator = CountingGrpc(store, GrpcEvaluator(args.engine, args.app, configured_secret() or ""))
    else:
        evaluator = CountingEvaluator(store)
    config = WorkerConfig(block_ms=0, retry_idle_ms=0, claim_idle_ms=0, max_new_tokens=args.max_new_tokens)
    drain(FlashWorker(store, evaluator, args.consumer, config, hook=hook))


if __name__ == "__main__":
    main()
