"""One decoder layer's attention for the rows of a packed forward, each row on
its own cache, read in place (the decoder loop calls it once per layer).

Row i's queries see its cached pieces (runs of pool blocks, shared and its
own: `KVState.segments`) and its own n_i new keys, causally; no row's cache
is copied into a padded batch. Two ways, chosen per row:

- **The native kernel, all such rows in one call** (ops with
  `attend_batch`, i.e. `native`; rows of up to `NATIVE_ATTENTION_MAX_TOKENS`
  new tokens: decode steps and typing rows). Each (token, head) is one
  query with one fixed order of sums, so a row's output is the same bits
  whether it shares the call or not; one call per layer, not one per row,
  because each call's marshalling costs about as much as a decode row's sums.
- **PyTorch's fused attention** (`scaled_dot_product_attention`; longer
  rows, and every row on the other ops): flash on a CPU, the maintained
  flash or memory-efficient kernels on a GPU, its reference maths in
  float64. The pieces are joined first: a sum split at piece ends would
  make the result depend on where the pool's blocks fell, not only on the
  tokens.

Each row's new keys/values are noted in `new_kv[row]`; the decoder loop
appends them to the row's cache after the last layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headstart.engine.kv.state import KVState

# the native attention loops over queries: past a few (a prefill chunk) products are faster
NATIVE_ATTENTION_MAX_TOKENS = 8


def layer_attention(attn, states: list[KVState], layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    rows: list[tuple[int, int, int]], new_kv: dict, ops=None) -> torch.Tensor:
    """The attention output [T, heads*head_dim] of the running rows, in packed
    order. q [1, heads, T, dim], k/v [1, kv_heads, T, dim] (RoPE applied);
    `rows`: (row index, packed start, new tokens) of each running row, in
    packed order; `states[row]` its cache. Fills `new_kv[row]` with the
    row's new (keys, values)."""
    heads, dim = q.shape[1], q.shape[-1]
    batch = getattr(ops, "attend_batch", None)
    native, outs = [], {}
    for b, start, n in rows:
        k_new, v_new = k[:, :, start:start + n], v[:, :, start:start + n]  # [1, kv_heads, n, dim]
        new_kv[b] = (k_new, v_new)
        state = states[b]
        pieces = state.segments(layer)  # read in place: runs of pool blocks (P0's shared, the row's own)
        pieces.append((k_new, v_new))
        if batch is not None and n <= NATIVE_ATTENTION_MAX_TOKENS:
            native.append((b, start, n, pieces))
        else:
            outs[b] = _fused_attention(attn, q, start, n, pieces)
    if native:
        whole = len(native) == len(rows)  # the common case: every row's tokens, in order: no gather
        queries = q[0].transpose(0, 1) if whole else torch.cat(
            [q[0, :, start:start + n].transpose(0, 1) for _, start, n, _ in native])  # [tokens, heads, dim]
        out = batch(queries, [(n, pieces) for _, _, n, pieces in native], attn.scaling).to(q.dtype)
        if whole:
            return out.view(-1, heads * dim)
        at = 0
        for b, _, n, _ in native:
            outs[b] = out[at:at + n].view(n, heads * dim)
            at += n
    return torch.cat([outs[b] for b, _, _ in rows], dim=0)


def _fused_attention(attn, q: torch.Tensor, start: int, n: int, pieces) -> torch.Tensor:
    """One row's attention [n, heads*dim] through PyTorch's fused attention (module doc)."""
    heads, dim = q.shape[1], q.shape[-1]
    # one call over every key, the pieces joined: how the pool's blocks happen to split a cache
    # (which blocks were free when it grew) must not change a bit of the result
    keys = torch.cat([k for k, _ in pieces], dim=-2) if len(pieces) > 1 else pieces[0][0]
    values = torch.cat([v for _, v in pieces], dim=-2) if len(pieces) > 1 else pieces[0][1]
    cached = keys.shape[-2] - n
    queries = q[:, :, start:start + n]  # [1, heads, n, dim]
    if cached == 0 or n == 1:  # a fresh row is plainly causal; one new token sees every key
        out = F.scaled_dot_product_attention(queries, keys, values, is_causal=cached == 0 and n > 1,
                                             scale=attn.scaling, enable_gqa=True)
    else:  # new token j sees the cache and new tokens 0..j
        mask = torch.ones((n, cached + n), dtype=torch.bool, device=q.device).tril(diagonal=cached)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=attn.scaling,
                                             enable_gqa=True)
    # [1, heads, n, dim] -> [n, heads*dim]
    return out[0].transpose(0, 1).reshape(n, heads * dim)
