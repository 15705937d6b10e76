"""Retention's cache move for `shift`: drop a span of the cache and re-rotate the rest.

The keys in a cache are stored *after* rotary position
encoding. Dropping `d` tokens at position `start` moves every later token
`d` positions back. RoPE is a rotation by the position's angle, so a kept
key is rotated back by its old position's angle and forward by its new
one's, with cos/sin from the model's own `rotary_emb` (`tables.rope`).
Rotating once by the angle of `-d` would be cheaper but is not the same:
the model computes each position's angle in float32, so the angle of `p-d`
is not the angle of `p` minus that of `d` (1e-7 off in layer 0, measured);
undoing the forward's own rotation (its exact inverse, see below) and
applying the new one leaves only the arithmetic's rounding (float32, or
float64 for a float64 cache: layer 0's keys then match a fresh prefill's to
1e-15, tests/test_data_sessions.py).
Values carry no position and are kept as they are.

Approximate by nature (the paper's and llama.cpp's context shift): the
kept tokens' keys and values were computed attending to the dropped rows,
which a fresh prefill would not see. `bench/data_sessions.py` measures the
drift against a fresh prefill.
"""

from __future__ import annotations

import torch

from headstart.engine.kv.state import KVState
from headstart.engine.kv.paged_cache import PagedCache
from headstart.tables.rope import rotary_cos_sin, rotary_function


@torch.inference_mode()
def shift_out(model, kv: KVState, start: int, count: int) -> KVState:
    """A new state: `kv` without tokens start..start+count-1, later keys
    re-rotated `count` positions back. `kv` itself is left unchanged (a
    query reading it keeps a consistent view)."""
    if count <= 0:
        return kv
    if start < 0 or start + count > kv.num_tokens:
        raise ValueError(f"cannot drop tokens {start}..{start + count - 1} of a {kv.num_tokens}-token cache")
    rotate = rotary_function(model)
    new = PagedCache()
    for index in range(kv.cache.num_layers):
        keys, values = kv.cache.keys(index), kv.cache.values(index)  # [1, heads, tokens, head_dim] (joined copies)
        work = torch.float64 if keys.dtype == torch.float64 else torch.float32
        later = keys[:, :, start + count:].to(work)
        n = later.shape[2]
        cos_old, sin_old = rotary_cos_sin(model, start + count, n, work, keys.device)  # [1, n, head_dim]
        cos_new, sin_new = rotary_cos_sin(model, start, n, work, keys.device)
        # R(a)^-1 = R(-a) / (cos^2 + sin^2): cos and sin come rounded from float32, so
        # their squares do not sum to 1 exactly (6e-8 off) and the plain R(-a) would scale keys
        norm = cos_old * cos_old + sin_old * sin_old
        _, unrotated = rotate(later[:, :0], later, cos_old / norm, -sin_old / norm)
        _, moved = rotate(later[:, :0], unrotated, cos_new, sin_new)
        new.append(index, keys[:, :, :start], values[:, :, :start])
        new.append(index, moved.to(keys.dtype), values[:, :, start + count:])
    return KVState(kv.ids[:start] + kv.ids[start + count:], new, None)


def frozen_part(kv: KVState, length: int) -> KVState:
    """A new private state holding `kv`'s first `length` tokens (slices; no model run)."""
    return KVState(kv.ids[:length], kv.cache.copied(length), None)
