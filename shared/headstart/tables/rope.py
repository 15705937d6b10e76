"""Rotary position encoding for table blocks: capture keys before it, apply it at placement.

Blocks keep their keys *before* rotary position encoding (RoPE) so that a
block can be placed at any position of a prompt. Two ways to get such keys
from a Hugging Face model, whose cache holds keys *after* RoPE:

1. invert the rotation of the cached keys (rotate by -theta): exact only up
   to rounding, since cos/sin are rounded and the rotation is recomputed;
2. keep the key projection's output while the group is encoded, before the
   forward rotates it.

We take (2), in the engine's `ModelRunner.encode_rows` (the runner's decoder
loop hands back each layer's keys before and after its rotary function): the
kept tensor *is* the loop's input to its rotary function, so re-applying that function with the
model's own cos/sin at the original positions gives back the forward's keys
bit for bit, in every dtype (tests/test_tables_rope.py checks float64 and
float32), and a block placed elsewhere is encoded exactly as the model would
encode it there.

At placement we call the model's own `apply_rotary_pos_emb` (looked up in the
module that defines its attention class) with cos/sin from the model's
`rotary_emb` in the model's dtype: the same function, inputs and arithmetic as
the forward pass.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch


class RopeError(RuntimeError):
    """The model does not have the rotary layout this module knows (model.model.rotary_emb, layers[i].self_attn)."""


def _decoder(model) -> torch.nn.Module:
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "layers"):
        raise RopeError(f"{type(model).__name__}: expected model.model.rotary_emb and model.model.layers")
    return inner


def rotary_function(model) -> Callable:
    """The model's `apply_rotary_pos_emb(q, k, cos, sin)`, from its attention class's module."""
    attn = _decoder(model).layers[0].self_attn
    fn = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if fn is None:
        raise RopeError(f"{type(attn).__module__} has no apply_rotary_pos_emb")
    return fn


def rotary_cos_sin(model, start: int, length: int, dtype: torch.dtype, device: torch.device):
    """cos, sin `# [1, length, head_dim]` for positions start..start+length-1, as the forward computes them."""
    positions = torch.arange(start, start + length, device=device).unsqueeze(0)  # [1, length]
    probe = torch.empty(0, dtype=dtype, device=device)  # rotary_emb reads only its dtype and device
    return _decoder(model).rotary_emb(probe, positions)


def apply_rope(model, keys_pre_rope: torch.Tensor, start: int) -> torch.Tensor:
    """Keys of a block placed with its first token at position `start`.

    Args:
        keys_pre_rope: `# [layers, kv_heads, tokens, head_dim]` keys before RoPE.
    Returns:
        `# [layers, kv_heads, tokens, head_dim]` keys after RoPE, as the model's
        cache would hold them for these tokens at these positions.
    """
    cos, sin = rotary_cos_sin(model, start, keys_pre_rope.shape[2], keys_pre_rope.dtype, keys_pre_rope.device)
    # q is an empty slice: the function rotates q and k alike, we only need k.
    # cos/sin [1, T, D] unsqueeze to [1, 1, T, D] and broadcast over layers and heads.
    _, keys = rotary_function(model)(keys_pre_rope[:, :0], keys_pre_rope, cos, sin)
    return keys
