"""The flash worker with a real Redis: versions answered and pushed, answers replaced and never
served stale, a worker killed (SIGKILL) mid-stream and restarted losing nothing and storing
nothing twice; and on a real DataSession (random:tiny)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from headstart.data.live_store import LiveStore, VersionEntry
from services.flash.evaluator import Evaluation, EvaluatorFailed
from services.flash.worker import FlashWorker, WorkerConfig
from tests.flash_fakes import CountingEvaluator, drain, evaluations

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ("how many readings?", "average value per sensor?")


@pytest.fixture
def store(redis_url):
    s = LiveStore(redis_url, prefix=f"t{uuid.uuid4().hex[:12]}", socket_timeout_s=5.0)
    s.test_url = redis_url  # for the worker processes
    yield s
    s.close()


def register(store: LiveStore, sid: str = "s") -> list[str]:
    return [store.register_flash(sid, q) for q in QUESTIONS]


def flash_events(store: LiveStore, sid: str = "s") -> list[tuple[str, int]]:
    return [(e.payload["id"], e.payload["version"]) for e in store.events_after(sid, None, count=10_000)
            if e.kind == "flash_ready"]


def worker(store, evaluator=None, **config) -> FlashWorker:
    config.setdefault("block_ms", 0)
    return FlashWorker(store, evaluator or CountingEvaluator(store), "w1", WorkerConfig(**config))


def test_each_version_is_answered_and_pushed(store):
    qids = register(store)
    w = worker(store)
    for v in (1, 2):
        store.publish_version("s", "t1", v, rows_added=1, dropped_total=0)
        assert w.step() == 1
        for qid, question in zip(qids, QUESTIONS):
            got = store.answer("s", qid)
            assert (got["question"], got["version"], got["sql"], got["rows"]) == (question, v, f"SELECT {v}", [[v]])
            assert got["logit_gap"] == 1.5 and got["computed_at"] > 0
    assert flash_events(store) == [(qids[0], 1), (qids[1], 1), (qids[0], 2), (qids[1], 2)]
    assert evaluations(store) == {"s:1": 1, "s:2": 1}
    assert store.num_pending_versions() == 0 and w.counts["acked"] == 2


def test_new_version_replaces_the_answer_and_lookup_is_never_stale(store):
    register(store)
    w = worker(store)
    store.publish_version("s", "t1", 1, 1, 0)
    w.step()
    assert store.lookup("s", QUESTIONS[0], store.current_version("s"))["version"] == 1
    store.publish_version("s", "t1", 2, 1, 0)
    # the data moved on and the worker has not answered yet: the old answer is not current
    assert store.lookup("s", QUESTIONS[0], store.current_version("s")) is None
    assert store.answer("s", register(store)[0])["version"] == 1
    w.step()
    current = store.current_version("s")
    assert store.lookup("s", QUESTIONS[0], current)["version"] == current == 2
    assert store.lookup("s", QUESTIONS[0], 1) is None


def test_a_live_cache_ahead_of_the_entry_answers_once_for_all(store):
    """Entries 1..3 queued; the replica's live cache is at 3: one evaluation, entries 2 and 3 skipped."""
    register(store)
    for v in (1, 2, 3):
        store.publish_version("s", "t1", v, 1, 0)
    w = worker(store, CountingEvaluator(store, live=True))
    assert w.step() == 3
    assert evaluations(store) == {"s:3": 1}
    assert w.counts["skipped"] == 4 and w.counts["acked"] == 3
    assert sorted(v for _, v in flash_events(store)) == [3, 3]


def test_only_unanswered_questions_are_evaluated(store):
    qids = register(store)
    w = worker(store)
    store.publish_version("s", "t1", 1, 1, 0)
    w.step()
    new = store.register_flash("s", "max value?")
    # the same version again (a redelivery): only the new question is asked
    asked: list[list[str]] = []

    class Spy(CountingEvaluator):
        def evaluate(self, entry, questions, max_new_tokens):
            asked.append(questions)
            return super().evaluate(entry, questions, max_new_tokens)

    FlashWorker(store, Spy(store), "w1", WorkerConfig(block_ms=0)).handle(VersionEntry("0-1", "s", "t1", 1, 1, 0))
    assert asked == [["max value?"]] and store.answer("s", new)["version"] == 1
    assert [store.answer("s", q)["version"] for q in qids] == [1, 1]


def test_session_not_held_is_retried_then_given_up(store):
    register(store)
    store.publish_version("s", "t1", 1, 1, 0)
    evaluator = CountingEvaluator(store, not_held={"s"})
    w = worker(store, evaluator, retry_idle_ms=0, max_attempts=3)
    w.step()
    assert store.num_pending_versions() == 1 and w.counts["retries"] == 1  # left pending
    evaluator.not_held.clear()  # the gateway reopened the session
    w.step()
    assert store.num_pending_versions() == 0 and evaluations(store) == {"s:1": 1}
    store.publish_version("s", "t1", 2, 1, 0)
    evaluator.not_held.add("s")
    for _ in range(3):
        w.step()
    assert w.counts["gave_up"] == 1 and store.num_pending_versions() == 0


def test_failed_evaluation_and_deleted_session_are_acked(store):
    class Failing:
        def evaluate(self, entry, questions, max_new_tokens) -> Evaluation:
            raise EvaluatorFailed("INVALID_ARGUMENT: question too long")

        def close(self):
            pass

    register(store)
    store.publish_version("s", "t1", 1, 1, 0)
    store.publish_version("gone", "t1", 1, 1, 0)
    store.register_flash("gone", "q?")
    store.delete_session("gone")
    w = worker(store, Failing())
    assert w.step() == 2
    assert w.counts["failed"] == 1 and w.counts["acked"] == 2 and store.num_pending_versions() == 0


def test_answer_rows_are_capped(store):
    class Many(CountingEvaluator):
        def evaluate(self, entry, questions, max_new_tokens):
            ev = super().evaluate(entry, questions, max_new_tokens)
            return Evaluation(ev.version, [{**a, "rows": [[i] for i in range(10)]} for a in ev.answers])

    qid = register(store)[0]
    store.publish_version("s", "t1", 1, 1, 0)
    worker(store, Many(store), max_answer_rows=4).step()
    got = store.answer("s", qid)
    assert got["rows"] == [[0], [1], [2], [3]] and got["rows_truncated"] is True


def run_child(store: LiveStore, consumer: str, crash_at: str = "") -> int:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}{os.pathsep}{ROOT}"}
    args = [sys.executable, "-m", "tests.flash_fakes", store.test_url, store.prefix, consumer]
    if crash_at:
        args += ["--crash-at", crash_at]
    return subprocess.run(args, cwd=ROOT, env=env, timeout=120).returncode


@pytest.mark.parametrize("stage,reevaluated", [("stored", False), ("evaluated", True)])
def test_killed_worker_restarts_without_loss_or_double_answers(store, stage, reevaluated):
    """SIGKILL at v3 (after storing / before storing), restart under the same name: every
    version is answered, each answer is stored and pushed exactly once."""
    qids = register(store)
    for v in range(1, 6):
        store.publish_version("s", "t1", v, 1, 0)
    assert run_child(store, "w1", crash_at=f"{stage}:3") == -signal.SIGKILL
    assert store.num_pending_versions() > 0  # v3 (and what the batch read after it) unacked
    done = {"s:1": 1, "s:2": 1, "s:3": 1}
    assert evaluations(store) == done
    for v in range(6, 8):  # versions published while the worker is down
        store.publish_version("s", "t1", v, 1, 0)
    assert run_child(store, "w1") == 0
    expected = {f"s:{v}": 1 for v in range(1, 8)}
    if reevaluated:  # killed before storing: v3 is evaluated again, but stored once
        expected["s:3"] = 2
    assert evaluations(store) == expected
    assert store.num_pending_versions() == 0
    events = flash_events(store)
    assert sorted(events) == sorted((q, v) for q in qids for v in range(1, 8))  # each once, none lost
    assert [store.answer("s", q)["version"] for q in qids] == [7, 7]


def test_another_worker_takes_over_a_dead_ones_entries(store):
    register(store)
    for v in (1, 2, 3):
        store.publish_version("s", "t1", v, 1, 0)
    assert run_child(store, "dead", crash_at="stored:2") == -signal.SIGKILL
    assert run_child(store, "heir") == 0  # claims "dead"'s pending entries (claim_idle_ms=0)
    assert evaluations(store) == {"s:1": 1, "s:2": 1, "s:3": 1} and store.num_pending_versions() == 0


def test_drain_helper_stops(store):
    """The child's drain loop ends on an empty stream (the tests above rely on it)."""
    w = worker(store)
    drain(w)
    assert w.counts["acked"] == 0


def test_versions_within_the_interval_are_answered_together(store):
    """min_interval_ms: a session's versions that come sooner than the interval
    after its last evaluation wait; the newest is answered once, the older
    acknowledged; nothing stays pending; other sessions are not held up."""
    import time

    qids = register(store)
    register(store, "other")
    w = worker(store, min_interval_ms=400)
    store.publish_version("s", "t1", 1, rows_added=1, dropped_total=0)
    assert w.step() == 1 and evaluations(store) == {"s:1": 1}
    for v in (2, 3):
        store.publish_version("s", "t1", v, rows_added=1, dropped_total=0)
    store.publish_version("other", "t1", 1, rows_added=1, dropped_total=0)
    w.step()
    assert evaluations(store) == {"s:1": 1, "other:1": 1}  # s waits its interval, other does not
    assert store.answer("s", qids[0])["version"] == 1 and w.counts["coalesced"] == 1
    time.sleep(0.45)
    w.step()
    assert evaluations(store) == {"s:1": 1, "other:1": 1, "s:3": 1}  # v2 and v3: one evaluation, at v3
    assert store.answer("s", qids[0])["version"] == 3
    assert store.num_pending_versions() == 0 and w.counts["acked"] == 3


def test_a_version_with_pushes_behind_it_is_left_to_the_newer_one(store):
    """max_coalesce_ms: versions published while the replica had acknowledged pushes waiting
    (lag_versions > 0) are acknowledged unanswered; the version that caught up is answered once;
    a session behind for longer than the bound is answered anyway."""
    import time

    qids = register(store)
    w = worker(store, max_coalesce_ms=300)
    for v in (1, 2, 3):
        store.publish_version("s", "t1", v, 1, 0, lag_versions=4 - v)
    w.step()
    assert evaluations(store) == {} and w.counts["coalesced"] == 3 and store.num_pending_versions() == 0
    store.publish_version("s", "t1", 4, 1, 0)  # caught up
    w.step()
    assert evaluations(store) == {"s:4": 1} and store.answer("s", qids[0])["version"] == 4
    # a steady backlog: left at first, answered once the session has been behind 300 ms
    store.publish_version("s", "t1", 5, 1, 0, lag_versions=2)
    w.step()
    assert evaluations(store) == {"s:4": 1}
    time.sleep(0.35)
    store.publish_version("s", "t1", 6, 1, 0, lag_versions=2)
    w.step()
    assert evaluations(store) == {"s:4": 1, "s:6": 1} and store.num_pending_versions() == 0


def test_without_max_coalesce_every_version_is_answered(store):
    register(store)
    w = worker(store)  # max_coalesce_ms=0
    for v in (1, 2):
        store.publish_version("s", "t1", v, 1, 0, lag_versions=1)
        w.step()
    assert evaluations(store) == {"s:1": 1, "s:2": 1} and w.counts["coalesced"] == 0
