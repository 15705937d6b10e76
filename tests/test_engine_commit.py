"""The commit rule (`engine/commit.py`) from a table of cache/target situations, no model."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.commit import CommitStep, plan_commit
from headstart.engine.kv import KVState

LOGITS = torch.zeros(4)

# (cached ids, logits at hand, target, chunk, want logits, expected step)
CASES = [
    ("empty cache", [], False, [1, 2, 3], 8, True, CommitStep(0, [1, 2, 3], True)),
    ("extend the rest", [1, 2], True, [1, 2, 3, 4], 8, True, CommitStep(2, [3, 4], True)),
    ("one chunk at a time", [1], True, [1, 2, 3, 4], 2, True, CommitStep(1, [2, 3], False)),
    ("crop an edit", [1, 2, 9, 9], True, [1, 2, 3], 8, True, CommitStep(2, [3], True)),
    ("caught up with logits: nothing", [1, 2, 3], True, [1, 2, 3], 8, True, CommitStep(3, [], True)),
    ("caught up without logits: backstep", [1, 2, 3], False, [1, 2, 3], 8, True, CommitStep(2, [3], True)),
    ("past the target: backstep", [1, 2, 3, 4], True, [1, 2, 3], 8, True, CommitStep(2, [3], True)),
    ("logits not wanted: no backstep", [1, 2, 3, 4], True, [1, 2, 3], 8, False, CommitStep(3, [], True)),
    ("empty target", [1, 2], True, [], 8, True, CommitStep(0, [], True)),
]


@pytest.mark.parametrize("situation,cached,logits,target,chunk,want,expected", CASES, ids=[c[0] for c in CASES])
def test_plan_commit(situation, cached, logits, target, chunk, want, expected):
    kv = KVState(list(cached), None, LOGITS if logits else None)
    assert plan_commit(kv, target, chunk, want) == expected
    assert kv.ids == cached  # planning changes nothing
