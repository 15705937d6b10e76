"""The catch-up rule: how a cache moves toward a target prompt, in one place.

A typing session's step (`sessions.typing_work`), a submit's prefill
(`requests.generation`) and a data session's rebuild bring a cache holding
ids C to a target T the same way: keep the longest common prefix of C and
T; when that is all of T but the logits after T's last token are wanted and
not at hand (the cache runs past T, or its last extension kept none), step
back one token so the next extension recomputes it; crop to what is kept;
extend by at most one chunk of the rest, keeping the logits after it only
when it reaches the end of the target and they are wanted. Byte-level BPE
is not prefix-stable, and the common prefix handles every edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row
from headstart.prompt import common_prefix_len


@dataclass(frozen=True)
class CatchUpPlan:
    """keep: cached tokens kept (the cache is cropped to them); chunk: the ids
    to extend by now; last: whether the chunk reaches the end of the target."""

    keep: int
    chunk: list[int]
    last: bool


def plan_catch_up(kv: KVState, target: list[int], chunk_tokens: int, want_logits: bool) -> CatchUpPlan:
    """The next step toward `target` (module doc). Reads the cache, changes nothing."""
    n = common_prefix_len(kv.ids, target)
    if want_logits and n == len(target) and n > 0 and (kv.num_tokens > n or kv.last_logits is None):
        n -= 1  # backstep: the logits after the target's last token are not at hand
    remaining = target[n:]
    chunk = remaining[:chunk_tokens]
    return CatchUpPlan(n, chunk, len(chunk) == len(remaining))


@dataclass(frozen=True)
class CatchUp:
    """One prepared step of the rule: the cache is already cropped to
    `plan.keep` (`dropped` tokens went); `row` extends it by `plan.chunk`."""

    plan: CatchUpPlan
    dropped: int
    row: Row


def start_catch_up(runner: ModelRunner, kv: KVState, target: list[int], chunk_tokens: int, want_logits: bool,
                   should_abort: Callable[[], bool] | None = None) -> CatchUp:
    """Plan the next step toward `target`, crop the cache to what it keeps and
    prepare the chunk's row (worker thread; no model run). The caller's job
    commits the row's result."""
    plan = plan_catch_up(kv, target, chunk_tokens, want_logits)
    dropped = kv.crop(plan.keep)
    return CatchUp(plan, dropped, Row(kv, plan.chunk, plan.last and want_logits, should_abort, runner=runner))
