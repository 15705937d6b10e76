"""A sampled candidate: one answer row decoded beside the greedy one, from the same prompt.

`SampledCandidate` is the job of candidate `index` of a candidate set
(`requests.candidates`): its cache starts as a share of the greedy
answer's (the prompt's blocks listed, not copied; its own blocks from its
first write on: `kv.paged_cache`). Forked at the prefill end, its first
token is sampled from the prompt's logits at hand (no forward); forked
later (the greedy answer already decoded ahead), its share is cropped to
the prompt less its last token, and its first step is a decode step of
that token, whose logits are the prompt's. Each further step is the one
decode step (`requests.decode_step`) with its own seeded `Sampler`. Its decode steps are rows of the same
packed forwards as the greedy answer's. It ends at an end-of-turn token or
`max_new_tokens`, which a submit may lower (`cap`) when it takes over a
candidate decoded during a pause to a longer cap: its answer is then its
first `max_new_tokens` tokens (`answer`), as a run to that cap would have
decoded them (its sampler is seeded per candidate and draws once per token,
whatever the cap). Its set's greedy-length bound (`bound`, known once the
greedy answer has ended at its stop token) caps it the same way, with the
finish reason "bounded": a sampled answer far longer than the greedy one is
rarely the right SQL, and its tail is what a checked answer waits for.
"""

from __future__ import annotations

from typing import Callable

from headstart.engine.errors import Cancelled
from headstart.engine.kv.state import KVState
from headstart.engine.requests.decode_step import decode_row, decoded_tokens
from headstart.engine.requests.sampling import Sampler, SamplingParams
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row, RowResult
from headstart.engine.sched.jobs import JobWork


class SampledCandidate(JobWork):
    """Candidate `index`'s decoding (worker thread, except `cancel` and `wait`).

    Args:
        state: a share of the greedy answer's cache, which starts with the prompt.
        params: sampled decoding (temperature, top-p, seed = the set's seed + index).
        rides: whether its steps may ride in others' forwards now (the scheduler's
            decode hint); None: always.
        bound: the set's greedy-length bound (`CandidateSet.bound`): the most tokens it
            may keep once known (None: not known yet, or none).
    """

    def __init__(self, index: int, runner: ModelRunner, state: KVState, prompt_ids: list[int],
                 params: SamplingParams, stop_ids: set[int], rides: Callable[[], bool] | None = None,
                 bound: Callable[[], int | None] | None = None):
        self.index, self.runner, self.state, self.params = index, runner, state, params
        self.prompt_ids, self._rides, self._bound = prompt_ids, rides, bound
        self.stop_ids = stop_ids
        self.max_new_tokens = params.max_new_tokens  # lowered by `cap`, from any thread
        self.sampler = Sampler(params, prompt_ids, stop_ids)
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None  # set once it ends: stop, length, cancelled, error
        self.error: BaseException | None = None
        self.job = None  # its worker job: `job.done` is set however it ends (a shutdown's drain too)
        self.held = False  # forked, queued only once the greedy answer ends (`CandidateSet.greedy_ended`)
        self._ended = False
        self._cancel_asked = False
        self._last: int | None = None  # the last token picked, not yet in the cache

    def start(self) -> bool:
        """Pick the first token from the prompt's logits when they are at hand (no
        forward), else crop the share for the step that computes them (worker
        thread). Returns whether steps follow."""
        n = len(self.prompt_ids)
        if self.state.ids[:n] != self.prompt_ids:
            raise ValueError("a candidate forks from a cache that starts with its prompt")
        try:
            if self.state.num_tokens != n or self.state.last_logits is None:
                self.state.crop(n - 1)
                self._last = self.prompt_ids[-1]  # its decode step gives the prompt's logits
                return True
            more = self._keep(self.sampler.pick(self.state.last_logits))
        except BaseException as exc:  # noqa: BLE001 - the candidate fails, never the greedy answer
            return self._end("error", exc)
        return more or self._end(self.finish_reason)

    def cancel(self) -> None:
        """Ask it to end: its next step ends it as cancelled (any thread)."""
        self._cancel_asked = True

    def cap(self, max_new_tokens: int) -> None:
        """Lower its cap (any thread): past it, its next step ends it, and `answer` cuts it there."""
        self.max_new_tokens = min(self.max_new_tokens, max_new_tokens)

    def limit(self) -> tuple[int, str]:
        """The most tokens it keeps and the finish reason of reaching it: its cap ("length"),
        or the greedy-length bound below it ("bounded")."""
        bound = self._bound() if self._bound is not None else None
        if bound is not None and bound < self.max_new_tokens:
            return bound, "bounded"
        return self.max_new_tokens, "length"

    def reached_cap(self) -> bool:
        """Whether its answer is complete at its cap or bound (its tokens up to it never change again)."""
        return len(self.token_ids) >= self.limit()[0]

    def answer(self) -> tuple[tuple[int, ...], str]:
        """Its tokens and finish reason, cut at its cap or bound: past it, the first tokens
        up to it and "length" or "bounded", whatever came after (the limit came first)."""
        (cap, reason), tokens = self.limit(), list(self.token_ids)
        if len(tokens) >= cap:
            return tuple(tokens[:cap]), reason
        return tuple(tokens), self.finish_reason or "cancelled"  # a job drained at shutdown never ran its end

    # -- the scheduler's hints -------------------------------------------------

    def decoding(self) -> bool:
        """Every step is a one-token decode step; it rides in others' forwards when `rides` says so."""
        return self._rides is None or bool(self._rides())

    def order_key(self) -> float:
        return 1.0  # as a decoding request's (`GenerationRequest.order_key`)

    # -- worker side -----------------------------------------------------------

    def step(self) -> "Row | bool":
        if self._cancel_asked:
            return self._end("cancelled", Cancelled("candidate cancelled"))
        if self.reached_cap():  # capped by a submit or bounded below what it had decoded
            return self._end(self.limit()[1])
        job = self.job
        return decode_row(self.runner, self.state, self._last, lambda: job is not None and job.preempt_requested)

    def commit(self, row: Row, result: RowResult) -> bool:
        if result.error is not None:
            return self._end("error", result.error)
        if not result.ran:  # left the forward for a more urgent job: the cache is unchanged, run again
            return True
        try:
            [token] = decoded_tokens(row, self.sampler.pick, 1, self.stop_ids)
        except BaseException as exc:  # noqa: BLE001
            return self._end("error", exc)
        return self._keep(token) or self._end(self.finish_reason)

    def _keep(self, token: int) -> bool:
        """Keep `token`; False when the answer ends here."""
        if token in self.stop_ids:
            self.finish_reason = "stop"
            return False
        self.token_ids.append(token)
        self.sampler.observe(token)
        self._last = token
        cap, reason = self.limit()
        if len(self.token_ids) >= cap:
            self.finish_reason = reason
            return False
        return True

    def _end(self, reason: str | None, error: BaseException | None = None) -> bool:
        if not self._ended:
            self._ended = True
            self.finish_reason, self.error = reason or "stop", error
            self.state = None  # its blocks go back to the pool now, not when the set is dropped
        return False
