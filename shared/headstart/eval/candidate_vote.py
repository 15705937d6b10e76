"""The vote among candidates' results: which group of equal results wins.

One rule for the served answer (`headstart.candidates.choice`) and the
evaluator's checked EX (`headstart eval --candidates`, its rescoring): the
largest group of SQL that ran wins; a tie goes to the group holding the
greedy answer (position 0), else to the group seen first (candidates are
seeded per index, so the vote is reproducible); SQL that failed (key None)
never wins while another ran.
"""

from __future__ import annotations

from collections.abc import Sequence


def winning_key(keys: Sequence[str | None], greedy_position: int = 0) -> str | None:
    """The result key of the winning group among `keys` (None: that candidate failed),
    or None when every one failed."""
    counts: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    for position, key in enumerate(keys):
        if key is None:
            continue
        counts[key] = counts.get(key, 0) + 1
        first_seen.setdefault(key, position)
    if not counts:
        return None
    greedy_key = keys[greedy_position] if 0 <= greedy_position < len(keys) else None
    return max(counts, key=lambda k: (counts[k], k == greedy_key, -first_seen[k]))
