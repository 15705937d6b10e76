"""The `quant` fast path: a GGUF model's forwards on the quantized kernels.

The weights of a model loaded from GGUF (`models.gguf_model`) stay in their
integer groups (`QuantLinear`); these ops run the weight-bound half of each
layer as few kernel calls as possible: q/k/v as one call (one quantization
of the normed input, the three matrices' blocks split over the threads
together), gate/up as one, o and down one each, the LM head one. Attention
runs through the same library's kernel (`QuantKernel.attend_batch`: every
row of a batched forward in one call per layer, the same bits on every
instruction set).

Every forward of such a model runs these ops (`model_runner.enable_fast_path`
resolves any mode to `quant` for it): the cold prefill, a prefix request
and an anticipatory session compute with the same kernels, and the
kernels' integer sums make a token's result independent of the other
tokens in its forward (batch invariance, tested).
"""

from __future__ import annotations

import torch

from headstart.engine.fast_ops import EagerOps
from headstart.kernels.quant import FusedSegments
from headstart.models.quantized import QuantLinear, is_quantized


class QuantOps(EagerOps):
    """The layers of a quantized model through fused kernel calls (module doc)."""

    name = "quant"

    def __init__(self, model):
        super().__init__(model)
        self.kernel = model.lm_head.kernel
        self._qkv, self._splits, self._o, self._gate_up, self._down = [], [], [], [], []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projs = (attn.q_proj, attn.k_proj, attn.v_proj)
            self._qkv.append(FusedSegments([p.matrix for p in projs]))
            self._splits.append([p.out_features for p in projs])
            self._o.append(attn.o_proj.segments)
            self._gate_up.append(FusedSegments([mlp.gate_proj.matrix, mlp.up_proj.matrix]))
            self._down.append(mlp.down_proj.segments)
        self._head = model.lm_head.segments

    def _linear(self, x: torch.Tensor, fused: FusedSegments) -> torch.Tensor:
        flat = x.reshape(-1, fused.k)
        return self.kernel.linear(flat, fused).view(*x.shape[:-1], -1)

    def qkv(self, index: int, hidden: torch.Tensor):
        x = self.layers[index].input_layernorm(hidden)
        return self._linear(x, self._qkv[index]).split(self._splits[index], dim=-1)

    def post(self, index: int, out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        layer = self.layers[index]
        hidden = residual + self._linear(out, self._o[index])
        gate, up = self._linear(layer.post_attention_layernorm(hidden), self._gate_up[index]).chunk(2, dim=-1)
        return hidden + self._linear(layer.mlp.act_fn(gate) * up, self._down[index])

    def head(self, rows: torch.Tensor) -> torch.Tensor:
        return self._linear(rows, self._head)

    def attend_batch(self, q: torch.Tensor, rows, scale: float) -> torch.Tensor:
        """All short rows' attention of a layer in one call (`row_attention.layer_attention`)."""
        return self.kernel.attend_batch(q.float().contiguous(), rows, scale)


def quant_supports(model) -> str | None:
    """None when `quant` runs this model (its weights are quantized), else why not."""
    return None if is_quantized(model) else "the model's weights are not quantized (load a GGUF model)"


__all__ = ["QuantOps", "QuantLinear", "quant_supports"]
