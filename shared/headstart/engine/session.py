"""A typing session: one user, one database, one evolving KV cache.

The caller (gateway, replay, tests) sends full-text snapshots with `update`;
the session asks its confirmation policy what to commit and brings its cache
there on the forward worker, always from the newest snapshot (a job that is
already queued picks up whatever text is newest when it runs; stale
extensions are never queued). `submit` makes the cache exactly the final
prompt and decodes. Exactness: the cache only ever holds a prefix of the
tokens the policy asked for, found by the longest common prefix, so the
generated tokens equal those of a cold prefill of the final prompt.

States. The session's state is one `SessionState` (IDLE, TYPING_DIRTY,
PREFILLING, READY, ANSWERING_AHEAD, GENERATING, CLOSED; the transitions are
listed once in `headstart.engine.states`), changed only by `_set`.

Steps. Its typing and answer-ahead steps run on the worker as explicit rows
(`headstart.engine.steps`): a step prepares its extension by the commit rule
(`headstart.engine.commit`) or the decode step (`headstart.engine.decode`)
without running the model, and commits the row's result when the worker has
run it.

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

Locking. The caller-side methods are thread-safe and never block on model
work, except `submit(...).result()` and `wait_idle()`. Both steps run on the
worker thread only; they read and change the session's state under its
lock, through the transition table (`headstart.engine.states`). A step's
row stops between decoder layers when a newer snapshot supersedes it or a
more urgent job elsewhere asks (`_should_stop`).

The session's plain data (its limits, its statistics, and the record of an
extension it has in flight) are the dataclasses below, before `Session`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from headstart.engine.answer_ahead import AnswerAhead
from headstart.engine.commit import Commit, start_commit
from headstart.engine.errors import InvalidInput, PromptTooLong, SessionClosed, StaleSequence, validate_text
from headstart.engine.generation import GenerationRequest, SamplingParams
from headstart.engine.kv import KVState
from headstart.engine.model_runner import ModelRunner
from headstart.engine.policy import CommitTarget, ConfirmationPolicy, PaperPolicy, looks_complete, riding_target
from headstart.engine.scheduler_types import Job, JobWork, Priority
from headstart.engine.states import SessionState, advance
from headstart.engine.steps import Row, RowResult
from headstart.engine.worker import ForwardWorker
from headstart.prompt import PromptBuilder, common_prefix_len, uncached_tokens

S = SessionState


@dataclass(eq=False)
class InFlight:
    """The extension a step of this session has in flight: the ids it will
    leave in the cache (None for an answer-ahead step), how many of them
    were cached before it, and whether a newer snapshot made it useless
    (polled between decoder layers: it then stops)."""

    ids: list[int] | None
    base: int
    superseded: bool = False


@dataclass(frozen=True)
class SessionLimits:
    max_text_chars: int = 4000
    max_prompt_tokens: int = 8192
    chunk_tokens: int = 256  # a submit waits at most one chunk of typing prefill
    answer_ahead_tokens: int = 32  # greedy answer tokens decoded during a pause (0 = off)
    # while answers stream, typing commits settled words only until the text has
    # not changed for this long (`Session._contended_target`; 0: always all)
    typing_settle_s: float = 0.3
    # ... and settled words only once this many of them are new (`policy.riding_target`)
    typing_bulk_tokens: int = 16
    # prompt-lookup drafts per greedy decode step (`engine.prompt_lookup`; 0: none)
    draft_tokens: int = 0


@dataclass
class SessionStats:
    cached_tokens: int
    prompt_tokens: int
    computed_tokens: int
    wasted_tokens: int
    memory_bytes: int  # keys/values this session holds privately
    seq: int
    shared_bytes: int = 0  # of its P0, shared with the other sessions on that P0 (not copied)


class Session:
    """Owns one KV cache. Public methods are thread-safe and never block on
    model work, except `submit(...).result()` and `wait_idle()`. The steps
    it runs on the worker are below, after its caller side and its state."""

    def __init__(
        self,
        session_id: str,
        runner: ModelRunner,
        worker: ForwardWorker,
        prompt: PromptBuilder,
        policy: ConfirmationPolicy,
        base: KVState,
        stop_ids: set[int],
        limits: SessionLimits = SessionLimits(),
        clock=time.monotonic,
    ):
        self.session_id, self.runner, self.worker = session_id, runner, worker
        self.prompt, self.policy, self.limits, self.clock = prompt, policy, limits, clock
        self.stop_ids = stop_ids
        self._kv = base  # touched only on the worker thread
        self._lock = threading.Lock()
        self._text, self._seq, self._last_change = "", -1, clock()
        self._read_seq = -1  # the snapshot the last typing step (or the submit) read
        self.status = S.IDLE  # changed only by _set (the table in headstart.engine.states)
        # Handles, not state: the typing or answer-ahead job queued or running
        # (the status says which), the policy's debounce recheck, the last
        # submit's request, and the extension in flight.
        self._job: Job | None = None
        self._recheck: threading.Timer | None = None
        self._generation: GenerationRequest | None = None
        self._inflight: InFlight | None = None
        self.aborted_extensions = 0
        self._ahead = AnswerAhead(limits.answer_ahead_tokens if policy.keeps_logits else 0, stop_ids,
                                  limits.draft_tokens)
        self._ahead_prompt: list[int] = []
        self.computed_tokens = 0
        self.wasted_tokens = 0
        self.last_used = clock()
        self._prompt_tokens = len(prompt.prompt_ids(""))
        # Called on the worker after each extension with (seq, cached, prompt
        # tokens): the serving tier turns it into progress messages. Must not block.
        self.on_progress: Callable[[int, int, int], None] | None = None

    # -- caller side --------------------------------------------------------

    def update(self, seq: int, text: str | bytes) -> bool:
        """A snapshot of the full question text. Returns False when `seq` is
        not newer than the last accepted one (a reordered message: ignored)."""
        text = validate_text(text, self.limits.max_text_chars)
        new_ids = self.prompt.prompt_ids(text) if self.policy.preempts else None
        with self._lock:
            self._check_open()
            if seq <= self._seq:
                return False
            self._text, self._seq, self._last_change = text, seq, self.clock()
            self.last_used = self._last_change
            self._preempt_locked(new_ids)
            self._kick_locked()
        return True

    def submit(self, seq: int, text: str | bytes, params: SamplingParams = SamplingParams()) -> GenerationRequest:
        """Make the cache the final prompt for `text` and start decoding."""
        started = time.perf_counter()
        text = validate_text(text, self.limits.max_text_chars)
        params.validate()
        final_ids = self.prompt.prompt_ids(text)
        if len(final_ids) + params.max_new_tokens > self.limits.max_prompt_tokens:
            raise PromptTooLong(
                f"prompt of {len(final_ids)} tokens + {params.max_new_tokens} new tokens exceeds "
                f"the limit of {self.limits.max_prompt_tokens}"
            )
        with self._lock:
            self._check_open()
            if seq < self._seq:
                raise StaleSequence(f"submit seq {seq} is older than snapshot {self._seq}")
            if self.status is S.GENERATING:
                raise InvalidInput("a generation is already running in this session")
            self._text, self._seq, self._last_change = text, seq, self.clock()
            self._read_seq = seq
            self.last_used = self._last_change
            self._cancel_recheck_locked()
            if self.policy.preempts:
                self._preempt_locked(final_ids)
            if self.status is S.ANSWERING_AHEAD:  # the step in flight, if any, still helps: no abort
                self._stop_speculation_locked(abort=False)
            # Racing the worker is safe here: a torn read of the cache or the
            # answer tokens fails the check in usable_for and yields [].
            known = self._ahead.usable_for(list(self._kv.ids), final_ids) if params.plain_greedy else []
            request = GenerationRequest(
                self.runner, self.prompt.decode, final_ids, params, self.stop_ids,
                self.limits.chunk_tokens, state=self._kv, on_finish=self._on_generation_finished,
                started=started, known=known,
                ahead=lambda: self._ahead.usable_for(self._kv.ids, final_ids), draft_tokens=self.limits.draft_tokens,
            )
            if not request.finished_early:
                request.enqueue_on(self.worker, Priority.SUBMIT, f"submit:{self.session_id}", owner=self.session_id)
            # a typing step still queued finds GENERATING and ends; one in flight finishes
            self._generation = request
            self._set(S.GENERATING)
        if request.finished_early:  # outside the lock: the finish callback takes it
            request.finish_now()
        return request

    def wait_idle(self, timeout: float | None = 30.0, speculation: bool = False) -> None:
        """Block until no background extension is queued or running (tests,
        replays): the way to await background work without sleeping. With
        `speculation`, also wait for answer-ahead decoding to stop."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                job, gen = self._job, self._generation
                if self.status is S.ANSWERING_AHEAD and not speculation:
                    job = None
            if (job is None or job.done.is_set()) and (gen is None or gen.done.is_set()):
                return
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if job is not None and not job.done.is_set():
                job.done.wait(remaining)
            elif gen is not None:
                gen.done.wait(remaining)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"session {self.session_id} still busy after {timeout} s")

    def close(self) -> None:
        with self._lock:
            self._set(S.CLOSED)
            if self._inflight is not None:
                self._inflight.superseded = True
            self._cancel_recheck_locked()
            if self._job is not None:
                self._job.cancel()
            if self._generation is not None:
                self._generation.cancel()

    def is_idle(self) -> bool:
        """No extension queued and no generation running: safe to evict."""
        with self._lock:
            return self.status not in (S.TYPING_DIRTY, S.PREFILLING, S.GENERATING)

    @property
    def kv_state(self) -> KVState:
        """The session's cache (for accounting: read-only, owned by the worker)."""
        return self._kv

    @property
    def closed(self) -> bool:
        return self.status is S.CLOSED

    def stats(self) -> SessionStats:
        kv = self._kv
        return SessionStats(
            cached_tokens=kv.num_tokens, prompt_tokens=self._prompt_tokens,
            computed_tokens=self.computed_tokens, wasted_tokens=self.wasted_tokens,
            memory_bytes=kv.nbytes(), seq=self._seq,
            shared_bytes=kv.shared_nbytes(),
        )

    def progress(self) -> tuple[int, int, int]:
        """(seq, tokens of the current full prompt already cached, its length)."""
        with self._lock:
            text, seq = self._text, self._seq
        return self._progress_of(text, seq)

    # -- state (under the lock) ------------------------------------------------

    def _set(self, status: SessionState) -> None:
        self.status = advance(self.status, status)

    def _check_open(self) -> None:
        if self.status is S.CLOSED:
            raise SessionClosed(f"session {self.session_id} is closed")

    def _kick_locked(self) -> None:
        """The text (or the policy's answer) may have changed: have a typing step
        read it. While generating, the end of the generation does."""
        if self.status is S.GENERATING:
            return
        if self.status is S.ANSWERING_AHEAD:  # the speculative answer is moot
            self._stop_speculation_locked(abort=True)
        self._enqueue_typing_locked()

    def _enqueue_typing_locked(self) -> None:
        """Queue a typing step unless one is queued or running (that one then
        reads the newest snapshot: it sees TYPING_DIRTY and runs again)."""
        if self._job is None or self._job.done.is_set():
            self._job = self.worker.enqueue(_TypingWork(self), Priority.STREAM, f"type:{self.session_id}",
                                            owner=self.session_id)
        self._set(S.TYPING_DIRTY)

    def _preempt_locked(self, new_ids: list[int] | None) -> None:
        """Stop the extension in flight if the new target keeps none of what it
        adds. One that adds some lasting tokens runs to the end even though its
        tail (the partial word, the turn end) will be cropped: aborting it
        would livelock a fast typist whose keystrokes come quicker than one
        forward pass, and the cache would never move until they paused."""
        inflight = self._inflight
        if (new_ids is not None and inflight is not None and inflight.ids is not None
                and common_prefix_len(new_ids, inflight.ids) <= inflight.base):
            inflight.superseded = True

    def _stop_speculation_locked(self, abort: bool) -> None:
        self._set(S.READY)
        if self._job is not None:
            self._job.cancel()
            self._job = None
        if abort and self._inflight is not None:
            self._inflight.superseded = True

    def _cancel_recheck_locked(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

    def _on_recheck(self) -> None:
        with self._lock:
            self._recheck = None
            if self.status is not S.CLOSED:
                self._kick_locked()

    def _release_locked(self, job: Job | None) -> None:
        if self._job is job:
            self._job = None

    # -- progress and the end of a generation ------------------------------------

    def _progress_of(self, text: str, seq: int) -> tuple[int, int, int]:
        full = self.prompt.prompt_ids(text)
        return seq, common_prefix_len(list(self._kv.ids), full), len(full)

    def _report_progress(self, text: str, seq: int) -> None:
        if self.on_progress is None:
            return
        try:
            self.on_progress(*self._progress_of(text, seq))
        except Exception:  # a broken listener must not stop the worker
            pass

    def _on_generation_finished(self, request: GenerationRequest) -> None:
        # read here, on the worker: crops of snapshots sent just before the
        # submit happen on the worker too, possibly after submit() returned
        request.wasted_before = self.wasted_tokens
        self.computed_tokens += request.computed_at_submit + max(0, len(request.token_ids) - 1)
        self.wasted_tokens += request.dropped_at_submit
        with self._lock:
            if self.status is not S.GENERATING or self._generation is not request:
                return
            self._set(S.IDLE)
            if self._seq > self._read_seq:  # a snapshot sent while it generated
                self._enqueue_typing_locked()

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
            self._job = self.worker.enqueue(_AheadWork(self), Priority.IDLE, f"ahead:{self.session_id}",
                                            owner=self.session_id)
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


class _TypingWork(JobWork):
    """A session's typing job: its steps and hints are the session's own."""

    def __init__(self, session: Session):
        self.session = session

    def step(self):
        return self.session._typing_step()

    def order_key(self) -> float:
        return self.session._typing_order()

    def cost(self) -> int:
        return self.session._typing_cost()

    def riding_cost(self) -> int:
        return self.session._riding_cost()


class _AheadWork(JobWork):
    """A session's answer-ahead job: a decode step that may ride in others'
    forwards once the question reads as finished (`Session._ahead_rides`)."""

    def __init__(self, session: Session):
        self.session = session

    def step(self):
        return self.session._ahead_step()

    def decoding(self) -> bool:
        return self.session._ahead_rides()
