"""`off`: the model's own modules, the reference every other kernel set must match.

The runner's decoder loop (`runner.decoder_loop`) calls an ops object for
the weight-bound parts around attention: `qkv` (input norm, q/k/v),
`post` (o projection, residual, post-attention norm, MLP, residual) and
`head` (the LM head on the rows that want logits). Every other kernel set
(`runner.ops`) subclasses this one and replaces those parts.
"""

from __future__ import annotations

import torch


class EagerOps:
    """The model's own modules (the reference every variant must match): `off`."""

    name = "off"

    def __init__(self, model):
        self.model = model
        self.layers = model.model.layers

    def qkv(self, index: int, hidden: torch.Tensor):
        """[1, T, hidden] -> q [1, T, heads*dim], k and v [1, T, kv_heads*dim]."""
        layer = self.layers[index]
        x = layer.input_layernorm(hidden)
        attn = layer.self_attn
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    def post(self, index: int, out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Attention output [1, T, heads*dim] and the layer's input -> the layer's output."""
        layer = self.layers[index]
        hidden = residual + layer.self_attn.o_proj(out)
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def head(self, rows: torch.Tensor) -> torch.Tensor:
        """Normed hidden rows [R, hidden] -> logits [R, vocab]."""
        return self.model.lm_head(rows)
