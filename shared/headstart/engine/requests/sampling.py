"""What a request asks of its decoding, and the one object that picks its tokens.

`SamplingParams` is the request's wish: greedy or sampled (temperature,
top-p, top-k, seed), penalties, a minimum length, whether the end-of-turn
token ends it, stop strings, log-probabilities. `Sampler` holds one
request's state for it (the seeded generator, the counts of the tokens
generated so far) and turns logits into the next token (`pick`), with that
token's log-probability when asked. `StopText` finds a stop string in the
growing answer text.

Log-probabilities are those of the logits the step produced, before
penalties and temperature (vLLM's raw log-probabilities). On the `native`
kernels with the screened LM head (`headstart.engine.runner.ops.screened_head`) every
logit but those of the candidates for the argmax is an estimate within a
bound, so the log-probabilities are estimates there too; exact elsewhere.

Exactness is defined for *plain greedy* decoding (`SamplingParams.plain_greedy`):
argmax of the model's own logits. Only then may a submit use the answer
tokens decoded ahead during a pause (`headstart.engine.sessions.answer_ahead`): any
penalty or minimum length changes which token is picked.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from headstart.engine.errors import InvalidInput

# The bounds the OpenAI API documents for its penalties.
PENALTY_RANGE = (-2.0, 2.0)
MAX_STOP_STRINGS = 4  # OpenAI's bound
MAX_STOP_CHARS = 64
MAX_TOP_LOGPROBS = 20  # OpenAI's bound


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when temperature == 0 (the default: exactness is defined for it).

    Attributes:
        max_new_tokens: answer tokens at most (finish_reason `length`).
        temperature, top_p, top_k: sampling (top_k 0: off); ignored when greedy.
        seed: the generator's seed when sampling.
        min_new_tokens: the end-of-turn tokens are banned until this many were generated.
        ignore_eos: the end-of-turn tokens do not end the answer (benchmarks: a fixed length).
        presence_penalty, frequency_penalty: OpenAI's, over the generated tokens.
        repetition_penalty: vLLM's/HF's (1: off), over the prompt and the generated tokens.
        stop: strings that end the answer; the text is cut before the first one found.
        logprobs, top_logprobs: return each token's log-probability and the top_logprobs
            most likely tokens at its position.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int = 0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0

    def validate(self) -> None:
        """Raises InvalidInput naming the first value out of range."""
        if not 1 <= self.max_new_tokens <= 4096:
            raise InvalidInput("max_new_tokens must be between 1 and 4096")
        # NOTE: `not x >= 0` rather than `x < 0`: NaN compares False both ways and must be refused
        if not (math.isfinite(self.temperature) and self.temperature >= 0) or not 0 < self.top_p <= 1:
            raise InvalidInput("temperature must be a finite number >= 0 and top_p in (0, 1]")
        if self.top_k < 0:
            raise InvalidInput("top_k must be >= 0 (0: off)")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise InvalidInput("min_new_tokens must be between 0 and max_new_tokens")
        for name in ("presence_penalty", "frequency_penalty"):
            if not PENALTY_RANGE[0] <= getattr(self, name) <= PENALTY_RANGE[1]:
                raise InvalidInput(f"{name} must be in [{PENALTY_RANGE[0]:g}, {PENALTY_RANGE[1]:g}]")
        if not 0 < self.repetition_penalty <= 10:
            raise InvalidInput("repetition_penalty must be in (0, 10]")
        if len(self.stop) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in self.stop):
            raise InvalidInput(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings of at most "
                               f"{MAX_STOP_CHARS} characters")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS or (self.top_logprobs and not self.logprobs):
            raise InvalidInput(f"top_logprobs must be 0..{MAX_TOP_LOGPROBS}, and only with logprobs")

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def plain_greedy(self) -> bool:
        """Argmax of the model's logits, ended by the end-of-turn token, nothing
        else asked of each step: the decoding that the answer-ahead tokens (and
        the exactness promise) are for."""
        return (self.temperature == 0 and not self.has_penalties and not self.min_new_tokens
                and not self.ignore_eos and not self.logprobs)


class Sampler:
    """Picks one request's tokens: `pick(logits)` for the next one, then
    `observe(token)` once it is kept. Runs on the worker thread only."""

    def __init__(self, params: SamplingParams | None, prompt_ids: list[int] = (), stop_ids: set[int] = frozenset()):
        self.params = params or SamplingParams()
        self._stop_ids = sorted(stop_ids)
        self._counts: Counter[int] = Counter()
        self._prompt_ids = sorted(set(prompt_ids)) if self.params.repetition_penalty != 1.0 else []
        self._generated = 0
        self.generator = torch.Generator().manual_seed(self.params.seed) if self.params.temperature > 0 else None
        self.last_logprob: TokenLogprobs | None = None  # of the token `pick` returned last (logprobs asked)

    def observe(self, token: int) -> None:
        """A token was kept (generated, or taken from the answer decoded ahead)."""
        self._generated += 1
        if self.params.has_penalties:
            self._counts[token] += 1

    def pick(self, logits: torch.Tensor) -> int:
        """The next token from `logits` (`# [vocab]`), after penalties and the minimum length
        (and, when asked, its log-probability in `last_logprob`)."""
        token = pick_token(self.adjusted(logits), self.params, self.generator)
        if self.params.logprobs:
            self.last_logprob = token_logprobs(logits, token, self.params.top_logprobs)
        return token

    def adjusted(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` with this request's penalties and bans applied (the same
        tensor, untouched, when there are none: the plain path copies nothing)."""
        p = self.params
        banned = self._generated < p.min_new_tokens and self._stop_ids
        if not p.has_penalties and not banned:
            return logits
        logits = logits.clone()
        if p.repetition_penalty != 1.0:
            seen = sorted(set(self._prompt_ids) | set(self._counts))
            if seen:
                index = torch.tensor(seen, device=logits.device)
                picked = logits[index]
                logits[index] = torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self._counts:
            index = torch.tensor(list(self._counts), device=logits.device)
            counts = torch.tensor(list(self._counts.values()), dtype=logits.dtype, device=logits.device)
            logits[index] -= p.frequency_penalty * counts + p.presence_penalty
        if banned:
            logits[torch.tensor(self._stop_ids, device=logits.device)] = float("-inf")
        return logits


@dataclass(frozen=True)
class TokenLogprobs:
    """A token's log-probability and the `top` (token id, log-probability) pairs, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, token: int, top: int = 0) -> TokenLogprobs:
    """Log-probabilities of `logits` (`# [vocab]`) in float64: `token`'s and the `top` most likely."""
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    best = torch.topk(logprobs, top) if top else None
    pairs = tuple(zip(best.indices.tolist(), best.values.tolist())) if best is not None else ()
    return TokenLogprobs(token, float(logprobs[token]), pairs)


def pick_token(logits: torch.Tensor, params: SamplingParams | None = None,
               generator: torch.Generator | None = None) -> int:
    """Greedy argmax (`params` None or temperature 0), or temperature +
    top-k + nucleus sampling."""
    if params is None or params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    if params.top_k and params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


class StopText:
    """Finds the first stop string in an answer's text as it grows.

    `find(text)` is called with the whole decoded text after each token and
    searches only where a new match can be (the tail the last token may have
    completed); it returns the index where the first stop string starts, or
    None. `holdback` is how many trailing characters a streamer must not send
    yet: they could be the start of a stop string.
    """

    def __init__(self, stop: tuple[str, ...]):
        self.stop = tuple(stop)
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self._searched = 0  # text before this index holds no stop string

    def find(self, text: str) -> int | None:
        if not self.stop:
            return None
        start = max(0, self._searched - self.holdback)
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        self._searched = len(text)
        return min(hits) if hits else None
