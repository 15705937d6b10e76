"""The prefix-caching baseline's radix tree: longest-prefix reuse, shared prefixes stored once,
LRU eviction by bytes. KV entries encode their token id so every reused position can be checked."""

from __future__ import annotations

import pytest
import torch

from bench.radix_cache import RadixCache
from headstart.engine.kv.state import KVState, state_from_layers

LAYERS = 2
BYTES_PER_TOKEN = LAYERS * 2 * 2 * 4  # layers x (k, v) x head_dim 2 x float32


def state_of(ids: list[int]) -> KVState:
    """A KVState whose keys/values at position t are ids[t] (and -ids[t])."""
    x = torch.tensor(ids, dtype=torch.float32).view(1, 1, -1, 1).expand(1, 1, len(ids), 2).contiguous()
    return state_from_layers(list(ids), [(x + layer, -x) for layer in range(LAYERS)])


def ids_in(state: KVState) -> list[int]:
    return [int(v) for v in state.cache.layers[0].keys[0, 0, :, 0]]


@pytest.mark.parametrize("query,expected", [
    ([1, 2, 3, 4, 5], 5),  # whole entry
    ([1, 2, 3, 9], 3),  # inside an edge
    ([1, 2, 7, 8, 9, 10], 6),  # along the second branch
    ([1, 2, 7, 8, 9, 10, 11], 6),  # longer than anything stored
    ([5, 1, 2], 0),
])
def test_longest_prefix_is_reused(query, expected):
    radix = RadixCache(1 << 20)
    radix.insert([1, 2, 3, 4, 5], state_of([1, 2, 3, 4, 5]))
    radix.insert([1, 2, 7, 8, 9, 10], state_of([1, 2, 7, 8, 9, 10]))
    match = radix.match(query)
    assert match.num_tokens == expected
    if expected:
        assert match.state.ids == query[:expected] and ids_in(match.state) == query[:expected]
        assert torch.equal(match.state.cache.layers[1].values[0, 0, :, 0], -torch.tensor(query[:expected]).float())
    else:
        assert match.state is None


def test_shared_prefixes_are_stored_once():
    radix = RadixCache(1 << 20)
    assert radix.insert([1, 2, 3, 4, 5], state_of([1, 2, 3, 4, 5])) == 5
    assert radix.insert([1, 2, 7, 8], state_of([1, 2, 7, 8, 99])) == 2  # a longer state is fine
    assert radix.insert([1, 2, 3], state_of([1, 2, 3])) == 0
    assert radix.num_tokens == 7 and radix.num_bytes == 7 * BYTES_PER_TOKEN


def test_least_recently_used_leaf_goes_first():
    radix = RadixCache(9 * BYTES_PER_TOKEN)
    radix.insert([1, 2, 3, 4], state_of([1, 2, 3, 4]))
    radix.insert([1, 2, 5, 6], state_of([1, 2, 5, 6]))  # 6 tokens stored
    radix.match([1, 2, 3])  # touches the first branch
    radix.insert([7, 8, 9, 10], state_of([7, 8, 9, 10]))  # 10 tokens: over budget
    assert radix.num_evictions == 1 and radix.num_tokens == 8
    assert radix.match([1, 2, 5, 6]).num_tokens == 2
    assert radix.match([1, 2, 3, 4]).num_tokens == 4


def test_a_state_must_hold_the_ids():
    with pytest.raises(ValueError, match="does not hold"):
        RadixCache(100).insert([1, 2], state_of([1, 3]))
