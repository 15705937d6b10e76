"""A typing session: one user, one database, one evolving KV cache.

The caller (gateway, replay, tests) sends full-text snapshots with `update`;
the session's typing job (`sessions.typing_work`) brings its cache toward
what the confirmation policy wants, always from the newest snapshot (a job
already queued picks up whatever text is newest when it runs; stale
extensions are never queued). Caught up, its answer-ahead job
(`sessions.answer_ahead`) decodes the greedy answer while the user pauses,
then its sampled candidates, if any (`sessions.ahead_candidates`). `submit` makes the cache exactly the final prompt and decodes (a
`GenerationRequest`). Exactness: the cache only ever holds a prefix of the
tokens the policy asked for, found by the longest common prefix, so the
generated tokens equal those of a cold prefill of the final prompt.

The session's state is one `SessionState` (transitions listed once in `headstart.engine.states`),
changed only by `_set`, under its lock. The caller-side methods are thread-safe and never block
on model work, except `submit(...).result()` and `wait_idle()`. Its jobs run on the worker
thread and change its state only through the worker-side methods below (`read_snapshot`,
`after_typing`, `read_ahead_step`, `after_ahead_step`). A step's row stops between decoder
layers when a newer snapshot supersedes it or a more urgent job elsewhere asks (`should_stop`).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from headstart.engine.errors import InvalidInput, PromptTooLong, SessionClosed, StaleSequence, validate_text
from headstart.engine.kv.state import KVState
from headstart.engine.requests.candidates import CandidateParams
from headstart.engine.requests.generation import GenerationRequest
from headstart.engine.requests.sampling import SamplingParams
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.sched.jobs import Job, Priority
from headstart.engine.sched.worker import ForwardWorker
from headstart.engine.sessions.ahead_candidates import AheadCandidates
from headstart.engine.sessions.answer_ahead import AheadStep, AheadWork, AnswerAhead
from headstart.engine.sessions.policy import CacheTarget, ConfirmationPolicy
from headstart.engine.sessions.records import SessionLimits, SessionStats
from headstart.engine.sessions.typing_work import InFlight, TypingSnapshot, TypingWork
from headstart.engine.states import SessionState, advance
from headstart.prompt import PromptBuilder, common_prefix_len

S = SessionState
_CURRENT = object()  # `typing_failed`'s default: the session's current job

__all__ = ["Session", "SessionLimits", "SessionStats"]  # the last two: re-exported


class Session:
    """Owns one KV cache (module doc): its caller side, its state, and the
    worker-side methods its typing and answer-ahead jobs call."""

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
        candidates: CandidateParams | None = None,
    ):
        self.session_id, self.runner, self.worker = session_id, runner, worker
        self.prompt, self.policy, self.limits, self.clock = prompt, policy, limits, clock
        self.stop_ids = stop_ids
        self._kv = base  # touched only on the worker thread
        self._lock = threading.Lock()
        self._text, self._seq, self._last_change = "", -1, clock()
        self._read_seq = -1  # the snapshot the last typing step (or the submit) read
        self.status = S.IDLE  # changed only by _set (the table in headstart.engine.states)
        # Handles, not state: the typing or answer-ahead job (the status says which),
        # the debounce recheck, the last submit's request, the extension in flight.
        self._job: Job | None = None
        self._recheck: threading.Timer | None = None
        self._generation: GenerationRequest | None = None
        self._inflight: InFlight | None = None
        self.aborted_extensions = 0
        self.ahead = AnswerAhead(limits.answer_ahead_tokens if policy.keeps_logits else 0, stop_ids,
                                 limits.draft_tokens)  # touched on the worker thread only
        self.candidates = AheadCandidates(self, candidates, limits.answer_ahead_tokens)
        self._ahead_prompt: list[int] = []
        self.computed_tokens = 0
        self.wasted_tokens = 0
        self.last_used = clock()
        self._prompt_tokens = len(prompt.prompt_ids(""))
        # (seq, cached, prompt tokens) after each extension, on the worker: must not block
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
            if text != self._text:  # the pause's candidates answer another question
                self.candidates.cancel()
            self._text, self._seq, self._last_change = text, seq, self.clock()
            self.last_used = self._last_change
            self._preempt_locked(new_ids)
            self._kick_locked()
        return True

    def submit(self, seq: int, text: str | bytes, params: SamplingParams = SamplingParams(),
               candidates: CandidateParams | None = None) -> GenerationRequest:
        """Make the cache the final prompt for `text` and start decoding; with
        candidates (None: the session's), the request's `candidates` is their set."""
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
            known = self.ahead.usable_for(list(self._kv.ids), final_ids) if params.plain_greedy else []
            cset = self.candidates.for_submit(final_ids, params, candidates)
            request = GenerationRequest(
                self.runner, self.prompt.decode, final_ids, params, self.stop_ids,
                self.limits.chunk_tokens, state=self._kv, on_finish=self._on_generation_finished,
                started=started, known=known,
                ahead=lambda: self.ahead.usable_for(self._kv.ids, final_ids), draft_tokens=self.limits.draft_tokens,
                on_prefilled=cset.fork if cset is not None and not cset.forked else None)
            if cset is not None:
                cset.attach(request)
                request.candidates = cset
            if not request.finished_early:
                request.enqueue_on(self.worker, Priority.SUBMIT, f"submit:{self.session_id}", owner=self.session_id)
            # a typing step still queued finds GENERATING and ends; one in flight finishes
            self._generation = request
            self._set(S.GENERATING)
        if request.finished_early:  # outside the lock: the finish callback takes it
            request.finish_now()
            self.candidates.fork_late(request.candidates)
        return request

    def wait_idle(self, timeout: float | None = 30.0, speculation: bool = False) -> None:
        """Block until no background extension is queued or running (tests, replays);
        with `speculation`, also until answer-ahead decoding stops."""
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
        """No more work; its blocks go back now (a queued job is withdrawn) or when a step in flight ends."""
        with self._lock:
            self._set(S.CLOSED)
            if self._inflight is not None:
                self._inflight.superseded = True
            self._cancel_recheck_locked()
            job, gen, self._job = self._job, self._generation, None
            if gen is not None:
                gen.cancel()  # its candidates too
            if (job is None or self.worker.withdraw(job)) and self._inflight is None \
                    and (gen is None or gen.done.is_set()):
                self._kv, self._generation = KVState(), None  # nothing else reaches the cache now
        self.candidates.cancel()

    def is_idle(self) -> bool:  # no extension queued and no generation running: safe to evict
        with self._lock:
            return self.status not in (S.TYPING_DIRTY, S.PREFILLING, S.GENERATING)

    @property
    def kv_states(self) -> list[KVState]:
        """Its cache and its candidates' (the pause's, the running answer's): what its budget charge counts."""
        cset = getattr(self._generation, "candidates", None)
        return [self._kv, *self.candidates.states(), *(cset.states() if cset is not None else [])]

    kv_state = property(lambda self: self._kv, doc="The session's cache (accounting: read-only, the worker's).")
    closed = property(lambda self: self.status is S.CLOSED)

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
            self._job = self.worker.enqueue(TypingWork(self), Priority.STREAM, f"type:{self.session_id}",
                                            owner=self.session_id)
        self._set(S.TYPING_DIRTY)

    def _preempt_locked(self, new_ids: list[int] | None) -> None:
        """Stop the extension in flight if the new target keeps none of what it adds (one
        that adds lasting tokens runs on: aborting it would livelock a fast typist)."""
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

    # -- worker side: what the typing and answer-ahead jobs read and report -------

    @property
    def text(self) -> str:
        """The newest snapshot's text (read by the jobs' hints)."""
        return self._text

    @property
    def last_change(self) -> float:
        """When the text last changed (monotonic seconds)."""
        return self._last_change

    def is_typing(self) -> bool:
        """A typing step is queued or running for the newest snapshot."""
        return self.status in (S.TYPING_DIRTY, S.PREFILLING)

    def read_snapshot(self) -> TypingSnapshot | None:
        """A typing step starts: the newest snapshot (now PREFILLING), or None
        when a submit took over or the session closed (the job ends)."""
        with self._lock:
            job = self._job
            if not self.is_typing():
                self._release_locked(job)
                return None
            self._read_seq = self._seq
            self._set(S.PREFILLING)
            return TypingSnapshot(job, self._text, self._last_change, self._seq)

    def typing_failed(self, job: "Job | None | object" = _CURRENT) -> None:
        """A typing step failed: nothing stays queued (the next snapshot queues a step)."""
        with self._lock:
            if self.status in (S.TYPING_DIRTY, S.PREFILLING):
                self._set(S.IDLE)
            self._release_locked(self._job if job is _CURRENT else job)

    def track(self, inflight: InFlight) -> None:
        """An extension of this session is in flight (`update` may supersede it)."""
        with self._lock:
            self._inflight = inflight

    def untrack(self, inflight: InFlight) -> None:
        with self._lock:
            if self._inflight is inflight:
                self._inflight = None

    def should_stop(self, inflight: InFlight, job: Job | None) -> bool:
        """Polled between decoder layers: stop for a newer snapshot, or a more urgent job
        elsewhere (not our own submit: a typing step's result is what it needs)."""
        if inflight.superseded:
            return True
        if not self.policy.preempts:  # the paper's policy awaits the step in flight
            return False
        if job is None or not job.preempt_requested:
            return False
        return self.status is not S.GENERATING

    def report_progress(self, text: str, seq: int) -> None:
        """Tell `on_progress` how much of `text`'s prompt is cached (a broken listener is ignored)."""
        if self.on_progress is None:
            return
        try:
            self.on_progress(*self._progress_of(text, seq))
        except Exception:  # a broken listener must not stop the worker
            pass

    def after_typing(self, job: Job | None, target: CacheTarget, wanted: bool, more: bool) -> bool:
        """After a typing step: more chunks, a newer snapshot, or caught up
        (then answer-ahead, if it is on and worth it). True: run again."""
        with self._lock:
            if target.recheck_at is not None and self.status is not S.CLOSED:
                self._cancel_recheck_locked()
                self._recheck = threading.Timer(max(0.0, target.recheck_at - self.clock()), self._on_recheck)
                self._recheck.daemon = True
                self._recheck.start()
            if not self.is_typing() or self._job is not job:
                self._release_locked(job)  # a submit took over, or closed
                return False
            if more or self.status is S.TYPING_DIRTY:
                return True
            self._job = None
            if not wanted or target.partial:  # the recheck brings the rest (`typing_work.riding_target_for`)
                self._set(S.IDLE)
                return False
            if not self.ahead.tokens and self.ahead.wants_more(self._kv, target.ids):
                # The first answer token needs no forward pass (it is the argmax
                # of the logits at hand): pick it now, so a submit that comes
                # before the worker's next turn streams it from its own thread.
                self.ahead.take_first(self._kv)
            if not self.ahead.wants_more(self._kv, target.ids):
                self._set(S.READY)
                self.candidates.after_greedy(self._kv, target.ids, self.ahead)
                return False
            self._ahead_prompt = target.ids
            self._job = self.worker.enqueue(AheadWork(self), Priority.IDLE, f"ahead:{self.session_id}",
                                            owner=self.session_id)
            self._set(S.ANSWERING_AHEAD)
            return False

    def read_ahead_step(self) -> AheadStep | None:
        """An answer-ahead step starts (its extension now in flight), or None
        when an update or a submit stopped answer-ahead."""
        with self._lock:
            if self.status is not S.ANSWERING_AHEAD:
                return None
            inflight = self._inflight = InFlight(None, self._kv.num_tokens)
            return AheadStep(self._job, self._ahead_prompt, inflight)

    def after_ahead_step(self, step: AheadStep, kept: int) -> bool:
        """After an answer-ahead step that kept `kept` tokens: True for another."""
        self.computed_tokens += kept
        with self._lock:
            if self._inflight is step.inflight:
                self._inflight = None
            if self.status is not S.ANSWERING_AHEAD or self._job is not step.job:
                return False  # stopped by an update or a submit meanwhile
            if self.ahead.wants_more(self._kv, self._ahead_prompt):
                return True  # the next token; or, if a more urgent job preempted this one, the same again later
            self._job = None
            self._set(S.READY)
            self.candidates.after_greedy(self._kv, self._ahead_prompt, self.ahead)
            return False
