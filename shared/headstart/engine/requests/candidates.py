"""Candidate sets: the greedy answer plus K-1 sampled ones, decoded as rows of the same forwards.

A request asked for `CandidateParams(k > 1)` forks when its prefill ends:
its cache then holds the prompt and the logits after it, and each sampled
candidate starts from a share of that cache (the prompt's blocks listed
once, each candidate's own blocks from its first write: copy on write,
`kv.paged_cache`), samples its first token from those logits (no forward),
and decodes one token per step as a `SampledCandidate`
(`requests.sampled`). The greedy request goes on untouched, so its tokens
are today's answer. Candidate `i` is seeded `seed + i` (a
`torch.Generator` each): the set is reproducible, the first k of a set
of K are the set of k, and the first n tokens of a candidate decoded to a
longer cap are those decoded to a cap of n (`hand_over`).

Once the greedy answer has ended at its stop token after L tokens, every
sampled candidate is bounded at L + `length_slack` tokens (`bound`): one
that reaches the bound ends "bounded" and is not run (`headstart.candidates`).
On Spider dev the longest candidate of a question is 50 tokens at the median,
40 with the bound, and the checked answer is right as often (docs/benchmarks.md).
The rule reads only the greedy answer's tokens, so a cold run and a session
whose candidates were decoded ahead bound the same candidates the same way.

The greedy answer goes first: the sampled candidates fork at its prefill
end (each one's first token sampled from the prompt's logits, no forward)
but are queued only once it has ended (`greedy_ended`). Riding in its
forwards, 8 rows made each of its steps 2.1-3.75x slower on a 2-core CPU
(`bench candidate-rows`), so the answer a person reads came 2.3-5.3x later;
after it they cost the greedy answer nothing and are bounded from their
first step. They are queued at IDLE, the answer-ahead class, as rows of
one packed forward (up to `max_batch_rows`), and yield to every new
prefill, so they never take what typing or other answers need.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable

from headstart.engine.errors import InvalidInput
from headstart.engine.kv.state import KVState
from headstart.engine.requests.generation import GenerationRequest
from headstart.engine.requests.sampled import SampledCandidate
from headstart.engine.requests.sampling import SamplingParams
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.sched.jobs import Priority

MAX_CANDIDATES = 16
DEFAULT_LENGTH_SLACK = 16  # tokens past the greedy answer's length a sampled candidate may keep


@dataclass(frozen=True)
class CandidateAnswer:
    """One finished candidate: `index` 0 is the greedy answer, i the one seeded `seed + i`;
    `finish_reason` is stop, length, cancelled or error. (What its SQL returns is
    `headstart.candidates`' business, above the engine.)"""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str


@dataclass(frozen=True)
class CandidateParams:
    """How many candidates a request decodes and how the sampled ones sample.

    Attributes:
        k: candidates in all, the greedy one included (1: the greedy answer alone, today's behaviour).
        temperature, top_p: the sampled candidates' sampling.
        seed: candidate i (1..k-1) samples with seed + i.
        wait_all: the caller waits for every candidate before the checked answer
            (else: the greedy answer and the candidates ready when it ends).
        length_slack: a sampled candidate keeps at most the greedy answer's length
            plus this many tokens once the greedy answer has stopped (None: no bound).
    """

    k: int = 1
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int = 0
    wait_all: bool = False
    length_slack: int | None = DEFAULT_LENGTH_SLACK

    def validate(self) -> None:
        """Raises InvalidInput naming the first value out of range."""
        if not 1 <= self.k <= MAX_CANDIDATES:
            raise InvalidInput(f"candidates must be between 1 and {MAX_CANDIDATES}")
        if not (math.isfinite(self.temperature) and self.temperature > 0) or not 0 < self.top_p <= 1:
            raise InvalidInput("candidate temperature must be a finite number > 0 and top_p in (0, 1]")
        if self.length_slack is not None and not 0 <= self.length_slack <= 1_000_000:
            raise InvalidInput("candidate length slack must be between 0 and 1000000 tokens (or none)")

    def sampling(self, index: int, max_new_tokens: int) -> SamplingParams:
        """The sampling of candidate `index` (1..k-1)."""
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              seed=self.seed + index)


class CandidateSet:
    """The candidates of one request: the greedy `GenerationRequest` (index 0) and the sampled ones.

    Built before its greedy request (whose `on_prefilled` is `fork`), then
    `attach`ed to it. `wait`, `candidates` and `cancel` are for any thread.
    """

    def __init__(self, params: CandidateParams, runner: ModelRunner, worker, prompt_ids: list[int],
                 stop_ids: set[int], detokenize: Callable[[list[int]], str], max_new_tokens: int,
                 name: str = "candidates", tenant: str | None = None, priority: Priority = Priority.IDLE,
                 rides: Callable[[], bool] | None = None):
        params.validate()
        self.params, self.runner, self.worker = params, runner, worker
        self.prompt_ids, self.stop_ids, self._detokenize = prompt_ids, stop_ids, detokenize
        self.max_new_tokens, self.name, self.tenant, self.priority = max_new_tokens, name, tenant, priority
        self._rides = rides  # the sampled candidates' riding hint during a pause (`SampledCandidate`)
        self._submitted = False  # taken over by a submit: the question is final, they always ride
        self.greedy: GenerationRequest | None = None
        self.sampled: list[SampledCandidate] = []
        self._lock = threading.Lock()
        self._cancelled = False
        self._fork_job = None  # a fork in a job of its own (`fork_in_job`)
        self.num_ahead_tokens = 0  # sampled tokens decoded before a submit took the set over (`hand_over`)
        self._greedy_length: int | None = None  # once it stopped (`greedy_stopped`, `greedy_ended`)
        self._greedy_ended = False  # the sampled candidates are queued from then on (`greedy_ended`)
        self._held: list[SampledCandidate] = []  # forked, waiting for the greedy answer to end

    def attach(self, greedy: GenerationRequest) -> None:
        """The greedy answer's request (a session's candidates forked during a pause get it at submit)."""
        self.greedy = greedy

    def greedy_stopped(self, num_tokens: int) -> None:
        """The greedy answer stopped after `num_tokens` tokens before a request of it
        exists (a session's answer decoded ahead during a pause): the bound is known now."""
        self._greedy_length = num_tokens

    def _may_ride(self) -> bool:
        """The sampled candidates' decode hint: a pause's ride in others' forwards as its
        `rides` says (a text that reads as a finished question); a submitted question's always."""
        return self._submitted or self._rides is None or bool(self._rides())

    def greedy_ended(self) -> None:
        """The greedy answer has ended (however: its request's finish, or the answer a
        session decoded ahead): the sampled candidates forked so far are queued now, and
        any forked later at once. Idempotent; any thread."""
        greedy = self.greedy
        if greedy is not None and greedy.error is None and greedy.finish_reason == "stop" \
                and self._greedy_length is None:  # its request is final here: the bound is known before they run
            self._greedy_length = len(greedy.token_ids)
        with self._lock:
            self._greedy_ended = True
            held, self._held = self._held, []
        for candidate in held:
            self._enqueue(candidate)

    def _enqueue(self, candidate: SampledCandidate) -> None:
        try:
            # apart from answers: its rows never slow another request's streaming answer (scheduler rule 2e)
            candidate.job = self.worker.enqueue(candidate, self.priority, f"{self.name}:candidate-{candidate.index}",
                                                owner=f"candidates-{id(self)}-{candidate.index}", tenant=self.tenant,
                                                apart_from_answers=True)
        except BaseException as exc:  # noqa: BLE001 - a full queue fails the candidate, not the answer
            candidate.cancel()
            candidate.error, candidate.finish_reason, candidate.state = exc, "error", None
        finally:
            candidate.held = False

    def bound(self) -> int | None:
        """The most tokens a sampled candidate keeps (any thread): the greedy answer's length +
        `length_slack` once it has stopped at its stop token; None before, or without a bound."""
        slack, n = self.params.length_slack, self._greedy_length  # set before any sampled step runs
        return None if slack is None or n is None else n + slack

    def hand_over(self, max_new_tokens: int) -> None:
        """A submit takes this set (decoded during a pause) over (any thread): the cap drops to
        the submit's `max_new_tokens`, each candidate cut there (`SampledCandidate.answer`), so
        the set is the one a run to that cap decodes; `num_ahead_tokens` counts what it kept."""
        with self._lock:
            self.max_new_tokens = min(self.max_new_tokens, max_new_tokens)
            self._submitted = True
            sampled = list(self.sampled)
        for candidate in sampled:
            candidate.cap(max_new_tokens)
        self.num_ahead_tokens = sum(min(len(c.token_ids), c.limit()[0]) for c in sampled)

    @property
    def forked(self) -> bool:
        with self._lock:
            return bool(self.sampled)

    # -- worker side -----------------------------------------------------------

    def fork(self, state: KVState) -> None:
        """Start the sampled candidates from `state`, the greedy answer's cache
        (at its prefill end: the prompt and its logits; or further on). Worker thread."""
        for index in range(1, self.params.k):
            with self._lock:
                if self._cancelled:
                    break
                max_new_tokens = self.max_new_tokens  # a submit's, once one took the set over
            candidate = SampledCandidate(index, self.runner, state.share(), self.prompt_ids,
                                         self.params.sampling(index, max_new_tokens), self.stop_ids, self._may_ride,
                                         self.bound)
            try:
                more = candidate.start()
            except ValueError as exc:  # the cache moved past another prompt: no candidates
                candidate.error, candidate.finish_reason, candidate.state, more = exc, "error", None, False
            with self._lock:
                hold = more and not self._greedy_ended
                if hold:  # queued once the greedy answer ends (`greedy_ended`)
                    candidate.held = True
                    self._held.append(candidate)
            if more and not hold:
                self._enqueue(candidate)
            with self._lock:
                self.sampled.append(candidate)
                candidate.cap(self.max_new_tokens)  # a `hand_over` that ran meanwhile did not see this one
                if self._cancelled:  # `cancel` ran meanwhile and did not see this one
                    candidate.cancel()

    def fork_in_job(self, state_of: Callable[[], KVState]) -> None:
        """Fork from `state_of()` in a job of its own (a submit whose whole answer
        was known ran no step to fork in); `wait` waits for it."""
        self._fork_job = self.worker.enqueue(lambda: self.fork(state_of()) or False, Priority.SUBMIT,
                                             f"{self.name}:fork", tenant=self.tenant)

    # -- caller side -----------------------------------------------------------

    def cancel(self) -> None:
        """End every candidate (the greedy request too); their next steps finish them."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            sampled = list(self.sampled)
        if self.greedy is not None:
            self.greedy.cancel()
        for candidate in sampled:
            candidate.cancel()

    def wait(self, timeout: float | None = None, all_candidates: bool = True) -> bool:
        """Wait for the greedy answer and (with `all_candidates`) every sampled candidate.
        Returns False on timeout."""
        if self.greedy is None or not self.greedy.done.wait(timeout):
            return False
        if not all_candidates:
            return True
        if self._fork_job is not None and not self._fork_job.done.wait(timeout):
            return False
        with self._lock:
            running = [c for c in self.sampled if not _finished(c)]
        # the greedy answer's end queued the held ones before its `done` was set
        return all(_finished(c) or (c.job is not None and c.job.done.wait(timeout)) for c in running)

    def states(self) -> list[KVState]:
        """The sampled candidates' caches still held (accounting: read-only)."""
        with self._lock:
            return [c.state for c in self.sampled if c.state is not None]

    def num_finished(self) -> int:
        """Candidates finished so far (the greedy one included)."""
        with self._lock:
            sampled = list(self.sampled)
        greedy = self.greedy is not None and self.greedy.done.is_set()
        return int(greedy) + sum(1 for c in sampled if _finished(c))

    def candidates(self) -> list[CandidateAnswer]:
        """The finished candidates by index (the greedy one first; one still running is left out)."""
        out = []
        greedy = self.greedy
        if greedy is not None and greedy.done.is_set():
            failed = greedy.error is not None and greedy.finish_reason != "cancelled"
            reason = "error" if failed else greedy.finish_reason
            text = "" if greedy.error is not None else greedy.result().text
            out.append(CandidateAnswer(0, text, tuple(greedy.token_ids), reason))
        with self._lock:
            sampled = list(self.sampled)
        for c in sampled:
            if _finished(c):
                tokens, reason = c.answer()
                out.append(CandidateAnswer(c.index, self._detokenize(list(tokens)), tokens, reason))
        return out


def _finished(candidate: SampledCandidate) -> bool:
    """Its job ended (or it needed none), or it reached its cap (a submit's, lower than the
    pause's) or the greedy-length bound: its next step ends it. One held for the greedy
    answer has not started."""
    if candidate.held:
        return False
    return candidate.job is None or candidate.job.done.is_set() or candidate.reached_cap()
