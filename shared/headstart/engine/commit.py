"""The commit rule: how a cache moves toward a target prompt, in one place.

Both a typing session (`Session._advance`) and a submit's prefill
(`GenerationRequest._prefill_step`) bring a cache holding ids C to a target
T the same way: keep the longest common prefix of C and T; when that is all
of T but the logits after T's last token are not at hand (the cache runs
past T, or its last extension kept no logits) and they are wanted, step back
one token so the next extension recomputes it; crop to what is kept; extend
by at most one chunk of the rest. Byte-level BPE is not prefix-stable, and
the common prefix handles every edit.
"""

from __future__ import annotations

from dataclasses import dataclass

from headstart.engine.kv import KVState
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
