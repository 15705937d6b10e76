"""A typing session: one user, one database, one evolving KV cache.

The caller (gateway, replay, tests) sends full-text snapshots with `update`;
the session asks its confirmation policy what to commit and brings its cache
there on the forward worker, always from the newest snapshot (a job that is
already queued picks up whatever text is newest when it runs; stale
extensions are never queued). `submit` makes the cache exactly the final
prompt and decodes. Exactness: the cache only ever holds a prefix of the
tokens the policy asked for, found by the longest common prefix, so the
generated tokens equal those of a cold prefill of the final prompt.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from headstart.engine.answer_ahead import AnswerAhead
from headstart.engine.commit import plan_commit
from headstart.engine.errors import InvalidInput, PromptTooLong, SessionClosed, StaleSequence, validate_text
from headstart.engine.generation import GenerationRequest, SamplingParams
from headstart.engine.kv import KVState, extend
from headstart.engine.policy import ConfirmationPolicy
from headstart.engine.worker import ForwardWorker, Job, Priority
from headstart.prompt import PromptBuilder, common_prefix_len, uncached_tokens


@dataclass(frozen=True)
class SessionLimits:
    max_text_chars: int = 4000
    max_prompt_tokens: int = 8192
    chunk_tokens: int = 256  # a submit waits at most one chunk of typing prefill
    answer_ahead_tokens: int = 32  # greedy answer tokens decoded during a pause (0 = off)


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
    model work, except `submit(...).result()` and `wait_idle()`."""

    def __init__(
        self,
        session_id: str,
        model,
        worker: ForwardWorker,
        prompt: PromptBuilder,
        policy: ConfirmationPolicy,
        base: KVState,
        stop_ids: set[int],
        limits: SessionLimits = SessionLimits(),
        clock=time.monotonic,
    ):
        self.session_id, self.model, self.worker = session_id, model, worker
        self.prompt, self.policy, self.limits, self.clock = prompt, policy, limits, clock
        self.stop_ids = stop_ids
        self._kv = base  # touched only on the worker thread
        self._lock = threading.Lock()
        self._text, self._seq, self._last_change = "", -1, clock()
        self._dirty = False
        self._job: Job | None = None
        self._timer: threading.Timer | None = None
        self._generation: GenerationRequest | None = None
        self._closed = False
        # The token ids the extension in flight will leave in the cache, how
        # many of them were cached before it, and a flag that makes it stop
        # between layers (see kv.extend).
        self._inflight: list[int] | None = None
        self._inflight_base = 0
        self._abort = False
        self.aborted_extensions = 0
        self._ahead = AnswerAhead(limits.answer_ahead_tokens if policy.keeps_logits else 0, stop_ids)
        self._ahead_prompt: list[int] = []
        self._speculating = False  # `_job` is an IDLE answer-ahead job
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
            if self._generation is not None and not self._generation.done.is_set():
                raise InvalidInput("a generation is already running in this session")
            self._text, self._seq, self._last_change = text, seq, self.clock()
            self.last_used = self._last_change
            self._cancel_timer_locked()
            if self.policy.preempts:
                self._preempt_locked(final_ids)
            if self._speculating:  # the step in flight, if any, still helps: no abort
                self._stop_speculation_locked(abort=False)
            # Racing the worker is safe here: a torn read of the cache or the
            # answer tokens fails the check in usable_for and yields [].
            known = self._ahead.usable_for(list(self._kv.ids), final_ids) if params.temperature == 0 else []
            request = GenerationRequest(
                self.model, self.prompt.decode, final_ids, params, self.stop_ids,
                self.limits.chunk_tokens, state=self._kv, on_finish=self._on_generation_finished,
                started=started, known=known,
                ahead=lambda: self._ahead.usable_for(self._kv.ids, final_ids),
            )
            self._generation = request
            if not request.finished_early:
                request.enqueue_on(self.worker, Priority.SUBMIT, f"submit:{self.session_id}", owner=self.session_id)
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
                if self._speculating and not speculation:
                    job = None
            if job is None and (gen is None or gen.done.is_set()):
                return
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if job is not None:
                job.done.wait(remaining)
            elif gen is not None:
                gen.done.wait(remaining)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"session {self.session_id} still busy after {timeout} s")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._abort = True
            self._cancel_timer_locked()
            if self._job is not None:
                self._job.cancel()
            if self._generation is not None:
                self._generation.cancel()

    def is_idle(self) -> bool:
        """No extension queued and no generation running: safe to evict."""
        with self._lock:
            return (self._job is None or self._speculating) and (
                self._generation is None or self._generation.done.is_set())

    @property
    def kv_state(self) -> KVState:
        """The session's cache (for accounting: read-only, owned by the worker)."""
        return self._kv

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> SessionStats:
        kv = self._kv
        return SessionStats(
            cached_tokens=kv.num_tokens, prompt_tokens=self._prompt_tokens,
            computed_tokens=self.computed_tokens, wasted_tokens=self.wasted_tokens,
            memory_bytes=kv.nbytes(), seq=self._seq,
            shared_bytes=kv.shared_nbytes(),
        )

    # -- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed(f"session {self.session_id} is closed")

    def _kick_locked(self) -> None:
        self._dirty = True
        if self._speculating:  # the text changed: the speculative answer is moot
            self._stop_speculation_locked(abort=True)
        if self._job is None and (self._generation is None or self._generation.done.is_set()):
            self._enqueue_typing_locked()

    def _enqueue_typing_locked(self) -> None:
        self._job = self.worker.enqueue(self._stream_step, Priority.STREAM, f"type:{self.session_id}",
                                        order_key=self._typing_order, owner=self.session_id,
                                        cost=self._typing_cost)

    def _preempt_locked(self, new_ids: list[int] | None) -> None:
        """Stop the extension in flight if the new target keeps none of what it
        adds. One that adds some lasting tokens runs to the end even though its
        tail (the partial word, the turn end) will be cropped: aborting it
        would livelock a fast typist whose keystrokes come quicker than one
        forward pass, and the cache would never move until they paused."""
        inflight = self._inflight
        if new_ids is not None and inflight is not None and common_prefix_len(new_ids, inflight) <= self._inflight_base:
            self._abort = True

    def _stop_speculation_locked(self, abort: bool) -> None:
        self._speculating = False
        if self._job is not None:
            self._job.cancel()
            self._job = None
        if abort:
            self._abort = True

    def _cancel_timer_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if not self._closed:
                self._kick_locked()

    def _stream_step(self) -> bool:
        """Worker: move the cache one chunk toward what the policy wants now."""
        with self._lock:
            if self._closed or (self._generation is not None and not self._generation.done.is_set()):
                self._job = None
                return False
            text, last_change, seq, self._dirty = self._text, self._last_change, self._seq, False
        target = self.policy.target(self.prompt, text, self.clock(), last_change)
        more = False
        wanted = target.ids is not None and len(target.ids) <= self.limits.max_prompt_tokens
        if wanted and not self._ahead.usable_for(self._kv.ids, target.ids):
            more = self._advance(target.ids)
            self._report_progress(text, seq)
        with self._lock:
            if target.recheck_at is not None and not self._closed:
                self._cancel_timer_locked()
                self._timer = threading.Timer(max(0.0, target.recheck_at - self.clock()), self._on_timer)
                self._timer.daemon = True
                self._timer.start()
            if more or self._dirty:
                return True
            self._job = None
            if not wanted or self._closed or not self._ahead.wants_more(self._kv, target.ids):
                return False
            if not self._ahead.tokens:
                # The first answer token needs no forward pass (it is the argmax
                # of the logits at hand): pick it now, so a submit that comes
                # before the worker's next turn streams it from its own thread.
                self._ahead.step(self.model, self._kv, should_abort=None)
            if self._ahead.wants_more(self._kv, target.ids):
                self._ahead_prompt, self._speculating = target.ids, True
                self._job = self.worker.enqueue(self._ahead_step, Priority.IDLE, f"ahead:{self.session_id}",
                                                owner=self.session_id)
            return False

    def _typing_order(self) -> float:
        """STREAM order: the session whose text changed least recently first.
        A user who paused is about to press Enter, and their text is stable;
        one still typing would have part of the extension cropped anyway."""
        return self._last_change

    def _typing_cost(self) -> int:
        """Tokens the next typing step will likely run (the worker's group
        hint): the newest full prompt past what the cache shares with it."""
        return uncached_tokens(self._kv.ids, self.prompt.prompt_ids(self._text), self.limits.chunk_tokens)

    def _should_stop(self) -> bool:
        """Polled between decoder layers: stop for a newer snapshot, or for a
        more urgent job elsewhere (another session's submit). Our own submit
        does not preempt this step: its result is what that submit needs."""
        if self._abort:
            return True
        if not self.policy.preempts:  # the paper's policy awaits the step in flight
            return False
        job = self._job
        if job is None or not job.preempt_requested:
            return False
        own_submit = self._generation is not None and not self._generation.done.is_set()
        return not own_submit

    def _ahead_step(self) -> bool:
        """Worker, IDLE priority: decode one more greedy answer token."""
        with self._lock:
            if not self._speculating or self._closed:
                return False
            self._abort = False
        stepped = self._ahead.step(self.model, self._kv, should_abort=self._should_stop)
        if stepped and len(self._ahead.tokens) > 1:
            self.computed_tokens += 1
        with self._lock:
            if not self._speculating:  # stopped by an update or a submit meanwhile
                return False
            if stepped and self._ahead.wants_more(self._kv, self._ahead_prompt):
                return True
            self._speculating, self._job = False, None
            return False

    def progress(self) -> tuple[int, int, int]:
        """(seq, tokens of the current full prompt already cached, its length)."""
        with self._lock:
            text, seq = self._text, self._seq
        return self._progress_of(text, seq)

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

    def _advance(self, target: list[int]) -> bool:
        kv = self._kv
        self._ahead.reset()
        # keeps_logits: the last token's logits at hand at submit (headstart policy)
        step = plan_commit(kv, target, self.limits.chunk_tokens, self.policy.keeps_logits)
        if step.keep < kv.num_tokens:
            self.wasted_tokens += kv.crop(step.keep)
        chunk, last = step.chunk, step.last
        with self._lock:
            self._inflight, self._inflight_base, self._abort = kv.ids + chunk, kv.num_tokens, False
        done = extend(self.model, kv, chunk, want_logits=last and self.policy.keeps_logits,
                      should_abort=self._should_stop)
        with self._lock:
            self._inflight = None
        self.computed_tokens += len(chunk)  # aborted work was spent too
        if not done:
            self.wasted_tokens += len(chunk)
            self.aborted_extensions += 1
            return True  # start over from the newest snapshot
        return not last

    def _on_generation_finished(self, request: GenerationRequest) -> None:
        # read here, on the worker: crops of snapshots sent just before the
        # submit happen on the worker too, possibly after submit() returned
        request.wasted_before = self.wasted_tokens
        self.computed_tokens += request.computed_at_submit + max(0, len(request.token_ids) - 1)
        self.wasted_tokens += request.dropped_at_submit
        with self._lock:
            if self._dirty and not self._closed and self._job is None:
                self._enqueue_typing_locked()
