"""`HEADSTART_FAST_PATH=auto`: the kernels are measured on the machine the engine starts on.

Which kernels read a CPU's weights fastest depends on the machine, even
between machines of one kind (docs/benchmarks-archive.md, "Per-token
speed"), so `auto` does not guess: at engine start it times each candidate kernel set on a scratch
cache and keeps the fastest (`choose_kernels`). `kernel_choice.measure_auto`
supplies the candidates (how to install each on the model's runner) and the
workloads (a prefill chunk, a lone decode step, a batched one); this module
only times them and decides, so a test can inject a fake timer.

Rounds are interleaved (every candidate runs every workload once per round,
the order alternating between rounds) so that load on a shared machine
falls on all candidates alike, and each workload's time is the min over
rounds (the least disturbed run). The score of a candidate is the weighted
sum of its workload times (`WEIGHTS`: the estimated milliseconds of one
32-token answer); the lowest wins, ties going to the first candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# One 32-token answer: one prefill chunk (the question, or a typing snapshot)
# and 31 decode steps, half of them alone and half in a forward shared with
# three other answers (`bench serve` at 4 typists). Prefill is measured so
# that a kernel set fast at decoding but slow at prefill cannot win.
PREFILL_TOKENS = 64
DECODE_ROWS = 4
WEIGHTS = {"prefill_64": 1.0, "decode_1": 15.5, "decode_4": 15.5}
MAX_ROUNDS = 3
MIN_ROUNDS = 2  # the first round pays first-call costs (oneDNN creates a primitive per shape)
BUDGET_S = 3.0  # no round is started that would end past this (packing the weights not counted)
# NOTE: on a loaded machine a round can take a minute (2 threads sharing 2
# cores with other work) and its timings say more about the load than about
# the kernels: past this the timing stops, and with no full round done the
# caller's fallback (a static rule) is used instead of a guess
DEADLINE_S = 12.0

# timer(kernels, workload, fn) -> seconds fn took; fn is run by the timer
Timer = Callable[[str, str, Callable[[], object]], float]
# a workload: prepare() -> the call to time (a fresh scratch state each time)
Workload = Callable[[], Callable[[], object]]


def wall_clock(kernels: str, workload: str, fn: Callable[[], object]) -> float:
    """The default timer: wall-clock seconds of `fn()`."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@dataclass(frozen=True)
class FastPathChoice:
    """The kernels a model's forwards run, and why.

    `requested` is HEADSTART_FAST_PATH as given; `kernels` what it resolved
    to. `measured` is True only when `auto` timed the candidates: then
    `timings_ms` holds each candidate's min ms per workload, `scores_ms` its
    weighted total (ms of one 32-token answer, `WEIGHTS`), `rounds` the
    rounds run and `seconds` the time measuring took (packing included)."""

    kernels: str
    requested: str
    measured: bool = False
    reason: str = ""
    timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    scores_ms: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for a log or a benchmark table."""
        if not self.measured:
            return f"{self.kernels} (requested {self.requested}{': ' + self.reason if self.reason else ''})"
        parts = [f"{name} {self.scores_ms[name]:.0f} ms/answer ["
                 + ", ".join(f"{w} {ms:.1f}" for w, ms in self.timings_ms[name].items()) + "]"
                 for name in self.scores_ms]
        return (f"{self.kernels} (auto, measured {self.rounds} rounds in {self.seconds:.1f} s, min ms per "
                f"workload: " + "; ".join(parts) + ")")

    def to_dict(self) -> dict:
        return {"kernels": self.kernels, "requested": self.requested, "measured": self.measured,
                "reason": self.reason, "timings_ms": self.timings_ms, "scores_ms": self.scores_ms,
                "rounds": self.rounds, "seconds": self.seconds}


def choose_kernels(candidates: dict[str, Callable[[], None]], workloads: Sequence[tuple[str, Workload]],
                   timer: Timer = wall_clock, weights: dict[str, float] | None = None,
                   max_rounds: int = MAX_ROUNDS, min_rounds: int = MIN_ROUNDS,
                   budget_s: float = BUDGET_S, deadline_s: float = DEADLINE_S,
                   fallback: str | None = None) -> FastPathChoice:
    """Time every workload under every candidate kernel set; return the lowest weighted total.

    Args:
        candidates: name -> install(): puts that kernel set on the model.
        workloads: (name, prepare) in the order they run within a round;
            prepare() is untimed and returns the call to time.
        timer: times one call (`wall_clock`; a test passes a fake).
        weights: per workload name (`WEIGHTS`); a workload without one counts 1.
        max_rounds, min_rounds, budget_s: at least `min_rounds` rounds, then
            more while the next round would end within `budget_s`.
        deadline_s, fallback: timing stops once `deadline_s` have passed
            (a loaded machine); the choice is then made from the full rounds
            done, or is `fallback` (default: the first candidate), not
            measured, when not one round was done.
    """
    if not candidates:
        raise ValueError("choose_kernels needs at least one candidate")
    weights = WEIGHTS if weights is None else weights
    names = list(candidates)
    best: dict[str, dict[str, float]] = {name: {} for name in names}
    start, rounds = time.perf_counter(), 0
    while rounds < max_rounds:
        elapsed = time.perf_counter() - start
        if rounds >= min_rounds and elapsed + elapsed / rounds > budget_s:
            break
        done = _round(candidates, workloads, timer, rounds % 2, start + deadline_s)
        if done is None:
            break
        for name, times in done.items():
            for workload, ms in times.items():
                best[name][workload] = min(ms, best[name].get(workload, ms))
        rounds += 1
    if rounds == 0:
        return FastPathChoice(kernels=fallback or names[0], requested="auto",
                              reason=f"timing stopped after {deadline_s:.0f} s before one round was done "
                                     "(a loaded machine): the static rule", seconds=time.perf_counter() - start)
    scores = {name: sum(weights.get(w, 1.0) * ms for w, ms in best[name].items()) for name in names}
    chosen = min(names, key=lambda n: scores[n])  # min keeps the first of equals
    return FastPathChoice(kernels=chosen, requested="auto", measured=True, timings_ms=best, scores_ms=scores,
                          rounds=rounds, seconds=time.perf_counter() - start)


def _round(candidates, workloads, timer: Timer, reverse: int, deadline: float) -> dict[str, dict[str, float]] | None:
    """One round: every candidate runs every workload; ms per candidate and
    workload. None once `deadline` has passed: a round cut short is dropped
    whole (its candidates would not have had the same chances)."""
    names = list(candidates)
    times: dict[str, dict[str, float]] = {name: {} for name in names}
    for name in names[::-1] if reverse else names:  # alternate who runs first
        candidates[name]()
        for workload, prepare in workloads:
            if time.perf_counter() > deadline:
                return None
            times[name][workload] = timer(name, workload, prepare()) * 1000.0
    return times
