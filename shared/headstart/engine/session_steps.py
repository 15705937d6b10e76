"""The worker side of a typing session: the steps `Session` queues on the
forward worker, as explicit rows (`headstart.engine.steps`).

* The **typing step** (STREAM priority) reads the newest snapshot, asks the
  policy what the cache should hold, and prepares one chunk toward it by the
  commit rule (`headstart.engine.commit.start_commit`); its commit counts
  the work, reports progress, and says whether to run again (more chunks,
  or a newer snapshot arrived: TYPING_DIRTY). Caught up, it picks the first
  answer token from the logits at hand and queues answer-ahead.
* The **answer-ahead step** (IDLE priority) is one decode step
  (`headstart.engine.decode`) of the greedy answer (`AnswerAhead`). Once
  the text reads as a finished question it is a decode step to the
  scheduler (`_ahead_rides`): it rides in other sessions' forwards and
  yields only to a new prefill; a step that yielded runs again later.

Both run on the worker thread only; they read and change the session's
state under its lock, through the transition table
(`headstart.engine.states`). A step's row stops between decoder layers
when a newer snapshot supersedes it or a more urgent job elsewhere asks
(`_should_stop`).
"""

from __future__ import annotations

import threading

from headstart.engine.commit import Commit, start_commit
from headstart.engine.policy import CommitTarget, PaperPolicy, looks_complete, riding_target
from headstart.engine.scheduler_types import Job, Priority
from headstart.engine.session_types import InFlight
from headstart.engine.states import SessionState
from headstart.engine.steps import Row, RowResult
from headstart.prompt import common_prefix_len, uncached_tokens

S = SessionState


class SessionSteps:
    """Mixed into `Session` (which owns every attribute used here)."""

    # -- worker side: typing ---------------------------------------------------

    def _typing_step(self) -> "Row | bool":
        """Worker: prepare the next chunk toward what the policy wants now."""
        try:
            return self._prepare_typing()
        except BaseException:
            with self._lock:  # a failed step leaves nothing queued: the next snapshot queues one
                self._typing_failed_locked(self._job)
            raise

    def _typing_failed_locked(self, job: Job | None) -> None:
        if self.status in (S.TYPING_DIRTY, S.PREFILLING):
            self._set(S.IDLE)
        self._release_locked(job)

    def _prepare_typing(self) -> "Row | bool":
        with self._lock:
            job = self._job
            if self.status not in (S.TYPING_DIRTY, S.PREFILLING):  # a submit took over, or closed
                self._release_locked(job)
                return False
            text, last_change, seq = self._text, self._last_change, self._seq
            self._read_seq = seq
            self._set(S.PREFILLING)
        now = self.clock()
        target = self.policy.target(self.prompt, text, now, last_change)
        wanted = target.ids is not None and len(target.ids) <= self.limits.max_prompt_tokens
        if not wanted or self._ahead.usable_for(self._kv.ids, target.ids):
            return self._after_typing(job, target, wanted, more=False)
        if job is not None and job.token_cap is not None and self.policy.keeps_logits:
            target = self._contended_target(target, text, now, last_change)
        self._ahead.reset()
        # keeps_logits: the last token's logits at hand at submit (headstart policy)
        inflight = InFlight(None, self._kv.num_tokens)
        # the scheduler caps a typing row that rides with streaming answers (its rule 2c)
        chunk = self.limits.chunk_tokens if job is None or job.token_cap is None \
            else max(1, min(self.limits.chunk_tokens, job.token_cap))
        commit = start_commit(self.runner, self._kv, target.ids, chunk, self.policy.keeps_logits and not target.partial,
                              lambda: self._should_stop(inflight, job),
                              lambda c, result: self._typing_committed(job, inflight, c, result, target, text, seq))
        self.wasted_tokens += commit.dropped
        inflight.ids, inflight.base = self._kv.ids + commit.step.chunk, self._kv.num_tokens
        with self._lock:
            self._inflight = inflight
        return commit.row

    def _contended_target(self, target: CommitTarget, text: str, now: float, last_change: float) -> CommitTarget:
        """What a typing row riding with streaming answers commits (the
        scheduler capped it: rule 2c): `policy.riding_target`. While the user
        types, the partial word and the end of the turn would be cropped at
        the next keystroke, so only settled words, in bulk; the whole prompt
        once the text reads as finished or has rested `typing_settle_s`. A
        recheck at that time brings the rest in even if no keystroke comes."""
        settle = self.limits.typing_settle_s
        if settle <= 0:
            return target
        complete = now - last_change >= settle or looks_complete(text)
        settled = [] if complete else self.prompt.partial_ids(PaperPolicy.committable(text))
        return riding_target(target.ids, settled, self._kv.ids, complete, self.limits.typing_bulk_tokens,
                             last_change + settle)

    def _typing_committed(self, job: Job | None, inflight: InFlight, commit: Commit, result: RowResult,
                          target: CommitTarget, text: str, seq: int) -> bool:
        with self._lock:
            if self._inflight is inflight:
                self._inflight = None
            if result.error is not None:  # the cache may be torn: nothing more from this step
                self._typing_failed_locked(job)
                raise result.error
        chunk = commit.step.chunk
        self.computed_tokens += len(chunk)  # aborted work was spent too
        if result.ran:
            more = not commit.step.last
        else:  # start over from the newest snapshot
            self.wasted_tokens += len(chunk)
            self.aborted_extensions += 1
            more = True
        self._report_progress(text, seq)
        return self._after_typing(job, target, True, more)

    def _after_typing(self, job: Job | None, target: CommitTarget, wanted: bool, more: bool) -> bool:
        """After a typing step: more chunks, a newer snapshot, or caught up
        (then answer-ahead, if it is on and worth it). True: run again."""
        with self._lock:
            if target.recheck_at is not None and self.status is not S.CLOSED:
                self._cancel_recheck_locked()
                self._recheck = threading.Timer(max(0.0, target.recheck_at - self.clock()), self._on_recheck)
                self._recheck.daemon = True
                self._recheck.start()
            if self.status not in (S.TYPING_DIRTY, S.PREFILLING) or self._job is not job:
                self._release_locked(job)  # a submit took over, or closed
                return False
            if more or self.status is S.TYPING_DIRTY:
                return True
            self._job = None
            if not wanted or target.partial:  # the recheck brings the rest (`_contended_target`)
                self._set(S.IDLE)
                return False
            if not self._ahead.tokens and self._ahead.wants_more(self._kv, target.ids):
                # The first answer token needs no forward pass (it is the argmax
                # of the logits at hand): pick it now, so a submit that comes
                # before the worker's next turn streams it from its own thread.
                self._ahead.take_first(self._kv)
            if not self._ahead.wants_more(self._kv, target.ids):
                self._set(S.READY)
                return False
            self._ahead_prompt = target.ids
            self._job = self.worker.enqueue(self._ahead_step, Priority.IDLE, f"ahead:{self.session_id}",
                                            owner=self.session_id, decoding=self._ahead_rides)
            self._set(S.ANSWERING_AHEAD)
            return False

    def _ahead_rides(self) -> bool:
        """The scheduler's `decoding` hint for an answer-ahead step: a decode
        step that may ride in others' forwards (and yields only to a new
        prefill) once the text reads as a finished question, since Enter
        usually follows within a second and each token decoded before it is
        one inter-token gap off the answer's last token. Before that (a pause
        mid-question) the step runs only when the worker has nothing else to
        do: the next keystroke would crop what it decoded."""
        return looks_complete(self._text)

    def _typing_order(self) -> float:
        """STREAM order: the session whose text changed least recently first.
        A user who paused is about to press Enter, and their text is stable;
        one still typing would have part of the extension cropped anyway."""
        return self._last_change

    def _typing_cost(self) -> int:
        """Tokens the next typing step will likely run (the worker's group
        hint): the newest full prompt past what the cache shares with it."""
        return uncached_tokens(self._kv.ids, self.prompt.prompt_ids(self._text), self.limits.chunk_tokens)

    def _riding_cost(self) -> int:
        """Tokens the next typing step commits if its row rides with streaming
        answers (the worker's rule-2c hint): 0 while only a partial word or
        fewer settled tokens than a bulk are new (`policy.riding_target`)."""
        if not self.policy.keeps_logits:  # the paper's policy commits as it would alone
            return self._typing_cost()
        if self.status not in (S.TYPING_DIRTY, S.PREFILLING):
            return 1  # a submit took over, or closed: the step only ends the job, let it run
        text = self._text
        target = self._contended_target(CommitTarget(self.prompt.prompt_ids(text)), text, self.clock(),
                                        self._last_change)
        if not target.partial:  # the whole prompt, as `_typing_cost` counts it
            return uncached_tokens(self._kv.ids, target.ids, self.limits.chunk_tokens)
        return len(target.ids) - common_prefix_len(self._kv.ids, target.ids)

    def _should_stop(self, inflight: InFlight, job: Job | None) -> bool:
        """Polled between decoder layers: stop for a newer snapshot, or for a
        more urgent job elsewhere (another session's submit). Our own submit
        does not preempt this step: its result is what that submit needs."""
        if inflight.superseded:
            return True
        if not self.policy.preempts:  # the paper's policy awaits the step in flight
            return False
        if job is None or not job.preempt_requested:
            return False
        return self.status is not S.GENERATING

    # -- worker side: answer-ahead ---------------------------------------------

    def _ahead_step(self) -> "Row | bool":
        """Worker, IDLE priority: the decode step of one more greedy answer token."""
        with self._lock:
            job = self._job
            if self.status is not S.ANSWERING_AHEAD:
                return False
            inflight = self._inflight = InFlight(None, self._kv.num_tokens)
        return self._ahead.step_row(self.runner, self._kv, self._ahead_prompt, lambda: self._should_stop(inflight, job),
                                    lambda kept: self._ahead_committed(job, inflight, kept))

    def _ahead_committed(self, job: Job | None, inflight: InFlight, kept: int) -> bool:
        if kept:
            self.computed_tokens += kept  # the cache grew by the step's token and the drafted ones kept
        with self._lock:
            if self._inflight is inflight:
                self._inflight = None
            if self.status is not S.ANSWERING_AHEAD or self._job is not job:
                return False  # stopped by an update or a submit meanwhile
            if self._ahead.wants_more(self._kv, self._ahead_prompt):
                return True  # the next token; or, if a more urgent job preempted this one, the same again later
            self._job = None
            self._set(S.READY)
            return False
