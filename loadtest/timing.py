"""What the load-test users time, without Locust (tested without gevent).

`AnswerClock`: one answer, from the moment it was asked (Enter, or the
request sent) to its last token, with a mark per streamed piece of text.
Its figures are the ones vLLM's `bench serve` and llm-locust report, all
measured at the client:

- TTFT: asked → the first piece of answer text;
- ITL (inter-token latency): the gaps between successive pieces (each piece
  is one token on headstart's streams: the engine sends a token at a time);
- the complete answer: asked → the end of the answer (what a person waits
  for before the SQL can run);
- output tokens (the server's count).

`arrival_times`: the open-loop schedule (a fixed rate or a Poisson process).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

ARRIVALS = ("fixed", "poisson")


@dataclass
class AnswerClock:
    started: float = field(default_factory=time.perf_counter)
    marks: list[float] = field(default_factory=list)
    ended: float | None = None

    def token(self, now: float | None = None) -> None:
        """A piece of answer text arrived."""
        self.marks.append(time.perf_counter() if now is None else now)

    def end(self, now: float | None = None) -> None:
        self.ended = time.perf_counter() if now is None else now

    @property
    def ttft_ms(self) -> float | None:
        return (self.marks[0] - self.started) * 1000.0 if self.marks else None

    @property
    def itl_ms(self) -> list[float]:
        return [(b - a) * 1000.0 for a, b in itertools.pairwise(self.marks)]

    @property
    def total_ms(self) -> float:
        end = self.ended if self.ended is not None else (self.marks[-1] if self.marks else self.started)
        return (end - self.started) * 1000.0


def arrival_times(rate: float, kind: str, seed: int | str = 0) -> Iterator[float]:
    """Seconds from the start at which requests arrive: every 1/rate s
    (`fixed`), or a Poisson process of that rate (`poisson`: exponential gaps)."""
    if rate <= 0:
        raise ValueError(f"the arrival rate must be > 0, got {rate}")
    if kind not in ARRIVALS:
        raise ValueError(f"unknown arrival process {kind!r}; valid: {', '.join(ARRIVALS)}")
    rng = random.Random(f"arrivals:{seed}")
    t = 0.0
    for i in itertools.count():
        if kind == "fixed":
            yield i / rate
        else:
            t += rng.expovariate(rate)
            yield t


def parse_length_sets(values: list[str]) -> list[tuple[int, int]]:
    """`IN:OUT` pairs (question tokens, answer tokens), e.g. `32:16`."""
    out = []
    for value in values:
        try:
            a, b = (int(x) for x in value.split(":"))
        except ValueError:
            raise ValueError(f"bad length set {value!r}: use IN:OUT, e.g. 32:16") from None
        if a < 1 or b < 1:
            raise ValueError(f"bad length set {value!r}: both lengths must be >= 1")
        out.append((a, b))
    if not out:
        raise ValueError("give at least one length set IN:OUT")
    return out


class QuestionMaker:
    """Questions of an exact length in tokens, made of real Spider questions
    (text-to-SQL words, not random tokens), cut at that token count."""

    def __init__(self, questions: list[str], encode, decode, seed: int | str = 0):
        if not questions:
            raise ValueError("no questions to make questions from")
        self.questions, self.encode, self.decode = questions, encode, decode
        self.rng = random.Random(f"questions:{seed}")

    def question(self, tokens: int) -> str:
        """About `tokens` tokens (exactly, unless re-tokenizing the cut merges its last two)."""
        text, ids = "", []
        while len(ids) < tokens:  # the whole text encoded at once: pieces encoded apart split differently
            text = f"{text} {self.rng.choice(self.questions)}".strip()
            ids = self.encode(text)
        return self.decode(ids[:tokens]) or "How many?"
