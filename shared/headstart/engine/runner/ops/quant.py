"""The `quant` kernel set: a GGUF model's forwards on the quantized kernels.

The weights of a model loaded from GGUF (`models.gguf_model`) stay in their
integer groups (`QuantLinear`); these ops run each decoder layer as one
kernel call (`QuantKernel.decoder_layer`: norms, q/k/v as one matmul, RoPE,
every row's attention over its cache in place, o, gate/up as one matmul,
SiLU, down, the residuals), so a decode step makes ~25 calls instead of
~40 torch operations per layer, and the LM head one call. The kernels give
the same bits on every instruction set.

Every forward of such a model runs these ops (`kernel_choice.resolve_choice`
resolves any mode to `quant` for it): the cold prefill, a prefix request
and an anticipatory session compute with the same kernels, and the
kernels' integer sums make a token's result independent of the other
tokens in its forward (batch invariance, tested).
"""

from __future__ import annotations

import threading

import torch

from headstart.engine.runner.ops.eager import EagerOps
from headstart.kernels.quant import FusedLayer, FusedSegments, LayerScratch


class QuantOps(EagerOps):
    """The layers of a quantized model through fused kernel calls (module doc)."""

    name = "quant"

    def __init__(self, model):
        super().__init__(model)
        self.kernel = model.lm_head.kernel
        self._head = model.lm_head.segments
        config = model.config
        self._scratch = threading.local()  # a LayerScratch per thread that runs forwards
        self._fused = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self._fused.append(FusedLayer(
                layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                FusedSegments([attn.q_proj.matrix, attn.k_proj.matrix, attn.v_proj.matrix]), attn.o_proj.segments,
                FusedSegments([mlp.gate_proj.matrix, mlp.up_proj.matrix]), mlp.down_proj.segments,
                config.num_attention_heads, config.num_key_value_heads, attn.head_dim,
                layer.input_layernorm.variance_epsilon, attn.scaling))

    def head(self, rows: torch.Tensor) -> torch.Tensor:
        """Normed hidden rows [R, hidden] -> logits [R, vocab] (one kernel call)."""
        return self.kernel.linear(rows.reshape(-1, self._head.k).float(), self._head)

    def decoder_layer(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      rows: list[tuple[int, int, int]], states, new_kv: dict) -> torch.Tensor:
        """The whole decoder layer `index` in one kernel call (`QuantKernel.decoder_layer`):
        hidden [1, T, hidden] -> the layer's output; `rows` (row, packed start, new tokens)
        of the running rows in packed order, `states[row]` its cache. Fills `new_kv[row]`
        with the row's new (keys, values) [1, kv_heads, n, dim], appended after the last layer."""
        out = hidden[0].contiguous().clone()
        pieces = [(n, states[b].segments(index)) for b, _, n in rows]
        new_k, new_v = self.kernel.decoder_layer(self._fused[index], out, cos[0], sin[0], pieces, self.scratch())
        for b, start, n in rows:
            new_kv[b] = (new_k[None, :, start:start + n], new_v[None, :, start:start + n])
        return out[None]

    def scratch(self) -> LayerScratch:
        """This thread's scratch block for the layers of its forwards."""
        scratch = getattr(self._scratch, "block", None)
        if scratch is None:
            scratch = self._scratch.block = LayerScratch()
        return scratch

    def end_forward(self) -> None:
        """A forward ended (or stopped): a prefill's large scratch block goes back."""
        self.scratch().end_forward()
