"""The commit rule: how a cache moves toward a target prompt, in one place.

Both a typing session's step (`Session._prepare_typing`) and a submit's prefill
(`GenerationRequest._prefill_step`) bring a cache holding ids C to a target
T the same way: keep the longest common prefix of C and T; when that is all
of T but the logits after T's last token are not at hand (the cache runs
past T, or its last extension kept no logits) and they are wanted, step back
one token so the next extension recomputes it; crop to what is kept; extend
by at most one chunk of the rest, keeping the logits after it only when it
reaches the end of the target and they are wanted. Byte-level BPE is not
prefix-stable, and the common prefix handles every edit.

`start_commit` is that step for both callers: it plans, crops, and returns
the chunk's extension as a row (`headstart.engine.steps`) for the worker
to run; the caller's `then` receives the row's result. Each caller keeps
its own accounting (a session's wasted tokens, a submit's dropped ones)
from the `Commit` it gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from headstart.engine.kv import KVState
from headstart.engine.model_runner import ModelRunner
from headstart.engine.steps import Row, RowResult
from headstart.prompt import common_prefix_len


@dataclass(frozen=True)
class CommitStep:
    """keep: cached tokens kept (the cache is cropped to them); chunk: the ids
    to extend by now; last: whether the chunk reaches the end of the target."""

    keep: int
    chunk: list[int]
    last: bool


def plan_commit(kv: KVState, target: list[int], chunk_tokens: int, want_logits: bool) -> CommitStep:
    """The next step toward `target` (module doc). Reads the cache, changes nothing."""
    n = common_prefix_len(kv.ids, target)
    if want_logits and n == len(target) and n > 0 and (kv.num_tokens > n or kv.last_logits is None):
        n -= 1  # backstep: the logits after the target's last token are not at hand
    remaining = target[n:]
    chunk = remaining[:chunk_tokens]
    return CommitStep(n, chunk, len(chunk) == len(remaining))


@dataclass
class Commit:
    """One prepared step of the commit rule: the cache is already cropped to
    `step.keep` (`dropped` tokens went), `row` extends it by `step.chunk`."""

    step: CommitStep
    dropped: int
    row: Row = field(repr=False, default=None)  # type: ignore[assignment] (set by start_commit)


def start_commit(runner: ModelRunner, kv: KVState, target: list[int], chunk_tokens: int, want_logits: bool,
                 should_abort: Callable[[], bool] | None,
                 then: Callable[[Commit, RowResult], bool]) -> Commit:
    """Plan the next step toward `target`, crop the cache to what it keeps and
    prepare the chunk's row (worker thread; no model run). `then(commit,
    result)` runs as the row's commit and returns whether more remains."""
    step = plan_commit(kv, target, chunk_tokens, want_logits)
    commit = Commit(step, kv.crop(step.keep))
    commit.row = Row(runner, kv, step.chunk, step.last and want_logits, should_abort,
                     lambda result: then(commit, result))
    return commit
