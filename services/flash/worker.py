"""The flash worker's loop: data-version entries in, stored answers and `flash_ready` events out.

For each entry of `{prefix}:data:versions` (consumer group `flash`):

1. the session's registered questions whose stored answer is older than the
   entry's version (answered ones are skipped: nothing is answered twice);
2. one evaluation of those questions on the owning replica's live cache;
3. each answer stored only if newer than the stored one, with its
   `flash_ready` event in the same Redis step (`LiveStore.store_answer`);
4. XACK.

An entry is acknowledged only after its answers are stored, so a worker that
dies anywhere before the ack finds the entry again when it restarts (its own
pending entries first, then those of consumers gone for `claim_idle_ms`),
and step 1 skips what it had already stored. An entry whose session the
replica does not hold (yet) stays pending and is retried after
`retry_idle_ms`, at most `max_attempts` times.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from headstart.data.live_store import LiveStore, LiveStoreError, VersionEntry
from services.flash.evaluator import Evaluator, EvaluatorFailed, EvaluatorRetry

log = logging.getLogger(__name__)
PRUNE_IDLE_MS = 3_600_000  # a consumer silent this long with nothing pending is a pod that is gone


@dataclass(frozen=True)
class WorkerConfig:
    """max_new_tokens: answer tokens per question; batch: entries read at once;
    block_ms: how long one read waits for new entries; claim_idle_ms: pending
    entries of other consumers idle this long are taken over; retry_idle_ms:
    a retried entry (session not held) waits this long; max_attempts: then it
    is acknowledged unanswered (logged); max_answer_rows: rows kept per answer;
    min_interval_ms: one session's questions are evaluated at most once per
    this long: a version that comes sooner waits, and the versions that come
    meanwhile are answered together by that one evaluation (0: every version
    at once); max_coalesce_ms: an entry whose replica still had acknowledged
    pushes behind it (`lag_versions`) is acknowledged unanswered, the newer
    version on its way answers for it, unless the session has been behind
    this long without an evaluation (0: every version answered)."""

    max_new_tokens: int = 128
    batch: int = 16
    block_ms: int = 1000
    claim_idle_ms: int = 60_000
    retry_idle_ms: int = 5_000
    max_attempts: int = 5
    max_answer_rows: int = 100
    min_interval_ms: int = 0
    max_coalesce_ms: int = 0


class FlashWorker:
    """Consumes version entries as `consumer` of the `flash` group (module docstring).

    Args:
        store: the live store.
        evaluator: answers the questions (`GrpcEvaluator` in a deployment).
        consumer: this worker's consumer name; a restart under the same name
            resumes its own pending entries at once.
        hook: called with a stage name ("evaluated", "stored") and the entry:
            tests make the process die there.
    """

    def __init__(self, store: LiveStore, evaluator: Evaluator, consumer: str, config: WorkerConfig | None = None,
                 hook: Callable[[str, VersionEntry], None] | None = None):
        self.store, self.evaluator, self.consumer = store, evaluator, consumer
        self.config = config or WorkerConfig()
        self._hook = hook or (lambda stage, entry: None)
        self.counts: Counter[str] = Counter()
        self._attempts: Counter[str] = Counter()
        self._last_claim = 0.0
        # min_interval_ms: when each session may be evaluated again, and its newest waiting entry
        self._next_allowed: dict[str, float] = {}
        self._waiting: dict[str, VersionEntry] = {}
        self._behind_since: dict[str, float] = {}  # max_coalesce_ms: since when a session's versions were left
        self.last_progress = time.monotonic()  # a read returned or an entry was handled (health)

    def recover(self) -> int:
        """Handle this consumer's own pending entries, then those other consumers
        abandoned; called once at start. Returns the entries handled."""
        entries = self.store.own_pending(self.consumer)
        entries += self.store.claim_versions(self.consumer, self.config.claim_idle_ms)
        self._last_claim = time.monotonic()
        handled = self._handle_all(entries)
        # consumers of pods long gone, with nothing pending (their entries were just claimed)
        self.store.prune_consumers(self.consumer, max(self.config.claim_idle_ms, PRUNE_IDLE_MS))
        return handled

    def step(self) -> int:
        """Read and handle one batch of new entries (waits up to `block_ms`), and from
        time to time retry pending ones. Returns the entries handled."""
        handled = 0
        if time.monotonic() - self._last_claim >= self.config.retry_idle_ms / 1000.0:
            self._last_claim = time.monotonic()
            # own entries left pending for a retry, then those of consumers gone for
            # claim_idle_ms (a live one's evaluation in progress is not taken over sooner)
            handled += self._handle_all(self.store.own_pending(self.consumer))
            handled += self._handle_all(self.store.claim_versions(self.consumer, self.config.claim_idle_ms))
        now = time.monotonic()
        for sid in [sid for sid, at in self._next_allowed.items() if at <= now and sid not in self._waiting]:
            del self._next_allowed[sid]  # past its interval: nothing to remember (bounded by active sessions)
        due = [entry for sid, entry in self._waiting.items() if now >= self._next_allowed[sid]]
        for entry in due:
            del self._waiting[entry.session_id]
        handled += self._handle_all(due)
        block_ms = self.config.block_ms
        if self._waiting:  # wake up when the first waiting session is due
            soonest = min(self._next_allowed[sid] for sid in self._waiting) - time.monotonic()
            block_ms = max(0, min(block_ms, int(soonest * 1000) + 1))
        entries = self.store.read_versions(self.consumer, self.config.batch, block_ms)
        self.last_progress = time.monotonic()
        return handled + self._handle_all(entries)

    def _wait_for_interval(self, entry: VersionEntry) -> bool:
        """min_interval_ms: keep `entry` (unacknowledged) until its session may be
        evaluated again; an older waiting entry of the session is acknowledged now
        (the evaluation of the newer answers at a version at least as new, and
        the newer stays pending in Redis, so a worker that dies loses neither).
        True when the entry waits."""
        sid = entry.session_id
        if time.monotonic() >= self._next_allowed.get(sid, 0.0):
            return False
        held = self._waiting.get(sid)
        if held is not None and held.entry_id == entry.entry_id:
            return True  # the same entry again (a retry of pending ones)
        if held is not None and held.version > entry.version:
            held, entry = entry, held  # the one that arrived is the older
        if held is not None:
            self.store.ack_version(held.entry_id)
            self.counts["coalesced"] += 1
        self._waiting[sid] = entry
        return True

    def _superseded(self, entry: VersionEntry) -> bool:
        """True when `entry` is left to a newer version (max_coalesce_ms): its replica had
        acknowledged pushes behind it, so their version comes within a forward or two, and
        evaluating this one (at FLASH) would only delay that ingestion. A session left that long
        is evaluated anyway: under a steady backlog its answers still move."""
        sid, limit, now = entry.session_id, self.config.max_coalesce_ms / 1000.0, time.monotonic()
        for other in [s for s, at in self._behind_since.items() if now - at > 10 * limit]:
            del self._behind_since[other]  # sessions closed while behind (bounded by active ones)
        if not entry.lag_versions or not limit:
            self._behind_since.pop(sid, None)
            return False
        since = self._behind_since.setdefault(sid, now)
        if now - since < limit:
            return True
        del self._behind_since[sid]  # answered now; the next backlog waits afresh
        return False

    def run(self, stop: threading.Event) -> None:
        """`recover()`, then `step()` until `stop` is set; Redis outages are logged and waited out."""
        recovered = False
        while not stop.is_set():
            try:
                if not recovered:
                    self.recover()
                    recovered = True
                self.step()
            except LiveStoreError as exc:
                self.counts["redis_errors"] += 1
                log.warning("flash worker %s: %s; retrying in 1s", self.consumer, exc)
                stop.wait(1.0)

    def _handle_all(self, entries: list[VersionEntry]) -> int:
        for entry in entries:
            self.handle(entry)
            self.last_progress = time.monotonic()
        return len(entries)

    def handle(self, entry: VersionEntry) -> bool:
        """Answer one entry's unanswered questions, store them, ack. False when the
        entry was left pending for a retry."""
        sid = entry.session_id
        if self._superseded(entry):
            self.store.ack_version(entry.entry_id)
            self.counts["coalesced"] += 1
            self.counts["acked"] += 1
            return True
        if self._wait_for_interval(entry):
            return False
        questions = self.store.flash_questions(sid)
        answered = self.store.answer_versions(sid)
        todo = {qid: q for qid, q in questions.items() if answered.get(qid, -1) < entry.version}
        self.counts["skipped"] += len(questions) - len(todo)
        if todo:
            try:
                evaluation = self.evaluator.evaluate(entry, list(todo.values()), self.config.max_new_tokens)
            except EvaluatorRetry as exc:
                return self._retry_later(entry, exc)
            except EvaluatorFailed as exc:
                self.counts["failed"] += 1
                log.warning("flash %s v%d: not answered: %s", sid, entry.version, exc)
                evaluation = None
            if self.config.min_interval_ms:
                self._next_allowed[sid] = time.monotonic() + self.config.min_interval_ms / 1000.0
            if evaluation is not None:
                self.counts["evaluations"] += 1
                self.counts["questions_evaluated"] += len(todo)
                self._hook("evaluated", entry)
                for qid, answer in zip(todo, evaluation.answers):
                    stored = self.store.store_answer(sid, qid, self._trimmed(answer), publish=True)
                    self.counts["stored" if stored else "not_stored"] += 1
                self._hook("stored", entry)
        self.store.ack_version(entry.entry_id)
        self._attempts.pop(entry.entry_id, None)
        self.counts["acked"] += 1
        return True

    def _retry_later(self, entry: VersionEntry, exc: Exception) -> bool:
        self._attempts[entry.entry_id] += 1
        if self._attempts[entry.entry_id] < self.config.max_attempts:
            self.counts["retries"] += 1
            log.info("flash %s v%d: %s; retrying later", entry.session_id, entry.version, exc)
            return False
        self.counts["gave_up"] += 1
        log.warning("flash %s v%d: gave up after %d attempts: %s", entry.session_id, entry.version,
                    self._attempts.pop(entry.entry_id), exc)
        self.store.ack_version(entry.entry_id)
        return True

    def _trimmed(self, answer: dict) -> dict:
        """The answer as stored: at most `max_answer_rows` rows (`rows_truncated` says when cut)."""
        rows = answer.get("rows") or []
        limit = self.config.max_answer_rows
        # max_new_tokens: the answer's token budget (a query asking another may get other text)
        return {**answer, "rows": rows[:limit], "rows_truncated": len(rows) > limit,
                "max_new_tokens": self.config.max_new_tokens}
