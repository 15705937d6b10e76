"""Bring a cache to the final prompt, then decode: the submit path.

A `GenerationRequest` runs as a job on the forward worker, one bounded step
at a time (one prefill chunk or one decode token), so other sessions' submits
interleave with it. The same code serves every mode: a cold request starts
from an empty cache, a prefix request from a share of P0 (or an assembly of
table blocks), a session from its own evolving cache.

Its state (`RequestState`, transitions in `headstart.engine.states`):
QUEUED -> PREFILL (the catch-up rule, `requests.catch_up`) -> DECODE (one
decode step at a time, `requests.decode_step`) -> DONE, CANCELLED or FAILED.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from headstart.engine.errors import Cancelled
from headstart.engine.kv.state import KVState
from headstart.engine.requests.catch_up import CatchUp, start_catch_up
from headstart.engine.requests.decode_step import decode_row, decoded_tokens
from headstart.engine.requests.prompt_lookup import draft
from headstart.engine.requests.sampling import Sampler, SamplingParams, StopText
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row, RowResult
from headstart.engine.sched.extensions import ExtensionDriver, ExtensionSteps
from headstart.engine.sched.jobs import JobWork
from headstart.engine.states import RequestState, advance
from headstart.prompt import common_prefix_len, uncached_tokens


@dataclass
class SubmitResult:
    token_ids: list[int]
    text: str
    ttft_ms: float
    total_ms: float
    prompt_tokens: int
    cached_tokens_at_submit: int
    computed_tokens_at_submit: int
    wasted_tokens: int = 0
    finish_reason: str = "stop"
    extra: dict = field(default_factory=dict)


_BEFORE_FIRST_TOKEN = (RequestState.QUEUED, RequestState.PREFILL)


class GenerationRequest(JobWork):
    """One submit: catch the cache up to `prompt_ids`, then stream tokens.

    Args:
        detokenize: token ids -> text (the prompt builder's `decode`).
        state: the cache to start from (a session's own); None: `prepare`'s.
        prepare: runs on the worker at the first step and returns the KVState
            to use (a share of P0), so its cost counts in the TTFT, or steps
            that build it (a table-block assembly), each forward of which
            runs as this request's row.
        on_finish: called once, on the thread that ends the request.
        ahead: the greedy answer tokens decoded before the submit (a session's
            answer-ahead), read when the prefill would start.
        known: the first of those, already known at submit: streamed at once.
        expected_cached: what `prepare` will hold (the scheduler's cost hint).
        draft_tokens: prompt-lookup drafts per decode step (plain greedy only).
        on_prefilled: called on the worker with the cache once the prefill ends
            (the prompt and its logits, before the first token is picked): a
            candidate set forks its sampled candidates there (`requests.candidates`).
    """

    def __init__(
        self,
        runner: ModelRunner,
        detokenize: Callable[[list[int]], str],
        prompt_ids: list[int],
        params: SamplingParams,
        stop_ids: set[int],
        chunk_tokens: int,
        state: KVState | None = None,
        prepare: Callable[[], "KVState | ExtensionSteps[KVState]"] | None = None,
        on_finish: Callable[["GenerationRequest"], None] | None = None,
        wasted_before: int = 0,
        started: float | None = None,
        ahead: Callable[[], list[int]] | None = None,
        known: list[int] | None = None,
        expected_cached: int = 0,
        draft_tokens: int = 0,
        on_prefilled: Callable[[KVState], None] | None = None,
    ):
        self.runner, self._detokenize = runner, detokenize
        self.prompt_ids, self.params, self.stop_ids = prompt_ids, params, stop_ids
        self.chunk_tokens = chunk_tokens
        self.state, self._prepare, self._on_finish = state, prepare, on_finish
        self._preparing: ExtensionDriver | None = None  # `prepare`'s steps, while they run
        # the row the last step returned: a step of `prepare`'s, a prefill chunk, or a decode step
        self._pending: "ExtensionDriver | CatchUp | None" = None
        self.token_ids: list[int] = []
        self._ahead = ahead  # greedy answer tokens decoded before the submit
        self._on_prefilled = on_prefilled
        self.candidates = None  # the `CandidateSet` this request is the greedy answer of, if any
        self._expected_cached = expected_cached  # what `prepare` will hold (a cost hint)
        # prompt-lookup drafts per decode step: plain greedy only (a penalty makes a token depend on the
        # ones before it being emitted first)
        self.draft_tokens = draft_tokens if params.plain_greedy else 0
        self.forwards = 0  # decode forwards run (with drafts, fewer than tokens)
        self.ahead_used = 0
        self._known: list[int] = []
        self.status = RequestState.QUEUED
        # TTFT counts from the caller's submit (tokenization included)
        self.started = started if started is not None else time.perf_counter()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.cached_at_submit: int | None = None
        self.computed_at_submit = 0
        self.wasted_before = wasted_before  # tokens the session cropped while typing
        self.dropped_at_submit = 0  # cached tokens the submit had to crop
        self.finish_reason = "stop"
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._stream: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel_asked = False  # by cancel(), on any thread: the next step ends the request
        self.job = None  # the worker job running the steps (see enqueue_on)
        self.decode_yields = 0  # decode steps stopped midway for a new submit
        self.sampler = Sampler(params, prompt_ids, stop_ids)
        self._stop_text = StopText(params.stop) if params.stop else None
        self.stop_at: int | None = None  # where a stop string starts in the text (it and what follows are cut)
        self.logprobs: list = []  # TokenLogprobs of each token of token_ids, when the request asked for them
        # Answer tokens already known at submit stream from the caller's
        # thread at once, without waiting for the step in flight on the worker.
        self.finished_early = False
        for token in known or []:
            self._known.append(token)
            if not self._emit(token):
                self.finished_early = True
                break

    # -- caller side --------------------------------------------------------

    def cancel(self) -> None:
        """Ask the request to end: its next step finishes it as CANCELLED
        (the step in flight, if any, completes first); its candidates end too."""
        self._cancel_asked = True
        if self.candidates is not None:
            self.candidates.cancel()

    def stream(self) -> Iterator[int]:
        """Token ids as they are generated; raises the request's error at the end."""
        while True:
            item = self._stream.get()
            if item is None:
                break
            yield item
        if self.error is not None:
            raise self.error

    def result(self, timeout: float | None = None) -> SubmitResult:
        if not self.done.wait(timeout):
            raise TimeoutError("generation did not finish in time")
        if self.error is not None:
            raise self.error
        text = self._detokenize(self.token_ids)
        return SubmitResult(
            token_ids=list(self.token_ids),
            text=text if self.stop_at is None else text[: self.stop_at],
            ttft_ms=(self.first_token_at - self.started) * 1000.0,
            total_ms=(self.finished_at - self.started) * 1000.0,
            prompt_tokens=len(self.prompt_ids),
            cached_tokens_at_submit=self.cached_at_submit or 0,
            computed_tokens_at_submit=self.computed_at_submit,
            wasted_tokens=self.wasted_before + self.dropped_at_submit,
            finish_reason=self.finish_reason,
            extra={"answer_tokens_ready_at_submit": self.ahead_used, "decode_forwards": self.forwards},
        )

    # -- worker side --------------------------------------------------------

    def order_key(self) -> float:
        """The worker's order within this request's class (`JobWork.order_key`).
        TTFT first, as prefill-first schedulers do:
        a request before its first token runs ahead of other requests'
        decode steps (key 1.0), and among those the shortest prefill first
        (key in [0, 1): tokens still to compute over one chunk; 0 when the
        first answer tokens are already known). A decoding request then
        waits at most one prefill chunk per new submit, and a submit that
        needs no forward pass is not held behind one that needs a long one."""
        if self.status not in _BEFORE_FIRST_TOKEN:
            return 1.0
        # read on the worker thread between steps (the scheduler's rule): no race
        if self._ahead is not None and self.params.plain_greedy and self._ahead():
            return 0.0
        return self.cost() / (self.chunk_tokens + 1)

    def decoding(self) -> bool:
        """The next step is a decode step (the worker may defer it, see
        `headstart.engine.sched.scheduler`)."""
        return self.status is RequestState.DECODE

    def enqueue_on(self, worker, priority, name: str, owner: str | None = None, **hints):
        """Queue this request's steps on `worker` with its scheduling hints
        (`hints`: more of `ForwardWorker.enqueue`'s, e.g. tenant, table_blocks);
        returns the job (whose preemption flag a decode step polls)."""
        # first answer tokens known at submit: the first step streams them, no forward to run first
        hints.setdefault("needs_forward", not self._known)
        self.job = worker.enqueue(self, priority, name, owner=owner, **hints)
        return self.job

    def _yield_requested(self) -> bool:
        job = self.job
        return job is not None and job.preempt_requested

    def cost(self) -> int:
        """About how many tokens the next step runs through the model (the
        scheduler's group-forming hint, read on the worker thread)."""
        if self.status not in _BEFORE_FIRST_TOKEN:
            return 1
        if self._preparing is not None:  # `prepare`'s steps: their pending forward
            return self._preparing.cost()
        state = self.state
        cached = state.ids if state is not None else self.prompt_ids[: self._expected_cached]
        return uncached_tokens(cached, self.prompt_ids, self.chunk_tokens)

    def step(self) -> "Row | bool":
        """One bounded unit of work (worker thread, no model run): the row of
        a prefill chunk or a decode step, or, when it needs no forward, True
        while more remains."""
        try:
            if self._cancel_asked:
                raise Cancelled("generation cancelled")
            if self.status is RequestState.QUEUED:
                self._set(RequestState.PREFILL)
            out = self._decode_step() if self.status is RequestState.DECODE else self._prefill_step()
        except BaseException as exc:
            return self._fail(exc)
        if not isinstance(out, Row) and not out:
            self._finish()
        return out

    def commit(self, row: Row, result: RowResult) -> bool:
        """The row of the last step ran: more chunks, the first token, or the next one."""
        pending, self._pending = self._pending, None
        try:
            if isinstance(pending, ExtensionDriver):
                more = pending.commit(row, result)
            elif isinstance(pending, CatchUp):
                more = self._prefilled(pending, result)
            else:
                more = self._decoded(row, result)
        except BaseException as exc:
            return self._fail(exc)
        if not more:
            self._finish()
        return more

    def _fail(self, exc: BaseException) -> bool:
        self.error = exc
        self._finish()
        return False

    def _set(self, status: RequestState) -> None:
        self.status = advance(self.status, status)

    def _prefill_step(self) -> "Row | bool":
        if self.state is None:
            row = self._prepare_step()
            if row is not None:
                return row
        kv, target = self.state, self.prompt_ids
        ahead = self._ahead() if self._ahead is not None and self.params.plain_greedy else []
        if self._known and ahead[: len(self._known)] != self._known:
            # unreachable while the session holds its generation slot: only an
            # answer-ahead step may run meanwhile, and it only appends
            raise RuntimeError("answer-ahead tokens changed under a submit")
        if ahead:  # the answer's first tokens are known: no forward pass
            self.cached_at_submit, self.ahead_used = len(target), len(ahead)
            self._set(RequestState.DECODE)
            if self._on_prefilled is not None:  # candidates fork from the cache past the prompt
                self._on_prefilled(kv)
            return all(self._emit(token) for token in ahead[len(self._known):])
        if self.cached_at_submit is None:
            self.cached_at_submit = common_prefix_len(kv.ids, target)
        catch_up = start_catch_up(self.runner, kv, target, self.chunk_tokens, True)
        self.dropped_at_submit += catch_up.dropped
        self._pending = catch_up
        return catch_up.row

    def _prepare_step(self) -> Row | None:
        """`prepare` at the first step: a state at once, or steps building one, each of their
        forwards this request's row (`ExtensionDriver`). None once `state` is set."""
        if self._preparing is None:
            got = self._prepare()
            if isinstance(got, KVState):
                self.state = got
                return None
            self._preparing = ExtensionDriver(got, self.runner)
        row = self._preparing.step()
        if row is False:  # the steps returned: their state is this request's
            self.state, self._preparing = self._preparing.value, None
            return None
        self._pending = self._preparing
        return row

    def _prefilled(self, catch_up: CatchUp, result: RowResult) -> bool:
        """A prefill chunk ran: more chunks, or the first token."""
        if result.error is not None:
            raise result.error
        self.computed_at_submit += len(catch_up.plan.chunk)
        if not catch_up.plan.last:
            return True
        self._set(RequestState.DECODE)
        if self._on_prefilled is not None:
            self._on_prefilled(self.state)
        return self._emit(self.sampler.pick(self.state.last_logits))

    def _decode_step(self) -> Row:
        guess = draft(self.prompt_ids + self.token_ids, self.draft_tokens) if self.draft_tokens else []
        return decode_row(self.runner, self.state, self.token_ids[-1], self._yield_requested, guess,
                          self._decode_limit())

    def _decode_limit(self) -> int:
        return self.params.max_new_tokens - len(self.token_ids)

    def _decoded(self, row: Row, result: RowResult) -> bool:
        if result.error is not None:
            raise result.error
        if not result.ran:
            self.decode_yields += 1
            return True  # a new submit came first; the cache is unchanged, the step runs again
        self.forwards += 1
        tokens = decoded_tokens(row, self.sampler.pick, self._decode_limit(), self.stop_ids)
        return all(self._emit(token) for token in tokens)

    def _emit(self, token: int) -> bool:
        """Keep `token` and stream it; False when the answer ends here (an
        end-of-turn token unless `ignore_eos`, a stop string, the length)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if token in self.stop_ids and not self.params.ignore_eos:
            self.finish_reason = "stop"
            return False
        self.token_ids.append(token)
        self.sampler.observe(token)
        if self.params.logprobs:  # before the token is streamed: the streamer reads it by index
            self.logprobs.append(self.sampler.last_logprob)
        if self._stop_text is not None:
            # searched after every token (a match below min_new_tokens is passed over, as vLLM does)
            at = self._stop_text.find(self._detokenize(self.token_ids))
            if at is not None and len(self.token_ids) >= self.params.min_new_tokens:
                # NOTE: this token is not streamed: it completed the stop string, and the
                # streamer sends the text before it from the result, so no stop text goes out.
                self.stop_at, self.finish_reason = at, "stop"
                return False
        self._stream.put(token)
        if len(self.token_ids) >= self.params.max_new_tokens:
            self.finish_reason = "length"
            return False
        return True

    def finish_now(self) -> None:
        """Complete a request whose known tokens already ended it (caller thread)."""
        self.cached_at_submit = len(self.prompt_ids)
        self.ahead_used = len(self._known)
        self._finish()

    def _finish(self) -> None:
        self.finished_at = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = self.finished_at
        if isinstance(self.error, Cancelled):
            self.finish_reason = "cancelled"
        final = RequestState.DONE if self.error is None else (
            RequestState.CANCELLED if isinstance(self.error, Cancelled) else RequestState.FAILED)
        self._set(final)
        self._stream.put(None)
        try:
            if self.candidates is not None:  # the sampled ones go after the greedy answer (`requests.candidates`)
                self.candidates.greedy_ended()
            if self._on_finish:
                self._on_finish(self)
        finally:
            self.done.set()
