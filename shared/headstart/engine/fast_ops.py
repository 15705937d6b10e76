"""The weight-bound half of a decoder layer, with a choice of kernels.

A decode step (and a typing row of a few tokens) is bound by reading the
weights once: on a CPU the matrix-vector products of the projections, the
MLP and the LM head are the whole cost. PyTorch's default (MKL) fp32 GEMV
reads ~21 GiB/s with 2 threads on the machine we measure on, llama.cpp
~59 GiB/s. `ModelRunner.extend_rows` runs every forward's layers itself and
calls one of these *ops* objects for the parts around attention:

- `qkv(index, hidden)`: input norm, then the q/k/v projections;
- `post(index, attn_out, residual)`: o projection, residual, post-attention
  norm, MLP, residual;
- `head(rows)`: the LM head on the (already normed) rows that want logits.

Variants (`FAST_PATHS`, picked once per model by its `ModelRunner`, `kernel_choice`):

- `off` (`EagerOps`): the model's own modules, the reference every other
  set must match.
- `onednn`: the linear layers as oneDNN packed matmuls (weights reordered
  once into oneDNN's blocked layout, q/k/v fused into one matrix and
  gate/up into another, so one call reads each layer's weights). Any M, no
  compile. float32 and bfloat16; other dtypes keep the `off` ops.
- `inductor`: `torch.compile` (freezing, max-autotune, inductor's C++
  micro-GEMM) of each layer's two blocks and the head, see `compiled_ops`.

Every forward of a model with a fast path runs through the same ops (the
runner's lone extension, `ModelRunner.extend`, included: it is a batch of
one row of `extend_rows`), so a cold prefill, a prefix request and an
anticipatory session all use the same kernels.
"""

from __future__ import annotations

import torch

FAST_PATHS = ("off", "auto", "onednn", "native", "inductor", "quant")
ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


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


class PackedLinear:
    """One linear layer (or several fused along the output axis) as a oneDNN
    packed matmul: the weight is reordered once, here, and read in that
    layout by every call."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None]):
        weight = torch.cat([w.detach() for w in weights], dim=0).contiguous()  # [N, K]
        if any(b is not None for b in biases):
            bias = torch.cat([b.detach() if b is not None else weight.new_zeros(w.shape[0])
                              for w, b in zip(weights, biases)])
        else:
            bias = None
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        # the batch-size hint only picks oneDNN's blocking; any M runs with it
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


class OneDNNOps(EagerOps):
    """The linear layers as oneDNN packed matmuls, q/k/v and gate/up fused."""

    name = "onednn"

    def __init__(self, model):
        super().__init__(model)
        self._qkv, self._o, self._gate_up, self._down, self._splits = [], [], [], [], []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projs = (attn.q_proj, attn.k_proj, attn.v_proj)
            self._qkv.append(PackedLinear([p.weight for p in projs], [p.bias for p in projs]))
            self._splits.append([p.out_features for p in projs])
            self._o.append(PackedLinear([attn.o_proj.weight], [attn.o_proj.bias]))
            self._gate_up.append(PackedLinear([mlp.gate_proj.weight, mlp.up_proj.weight],
                                              [mlp.gate_proj.bias, mlp.up_proj.bias]))
            self._down.append(PackedLinear([mlp.down_proj.weight], [mlp.down_proj.bias]))
        head = model.lm_head
        self._head = PackedLinear([head.weight], [head.bias])

    def qkv(self, index: int, hidden: torch.Tensor):
        x = self.layers[index].input_layernorm(hidden)
        return self._qkv[index](x).split(self._splits[index], dim=-1)

    def post(self, index: int, out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        layer = self.layers[index]
        hidden = residual + self._o[index](out)
        gate, up = self._gate_up[index](layer.post_attention_layernorm(hidden)).chunk(2, dim=-1)
        return hidden + self._down[index](layer.mlp.act_fn(gate) * up)

    def head(self, rows: torch.Tensor) -> torch.Tensor:
        return self._head(rows)


def onednn_supports(model) -> bool:
    """oneDNN packed matmuls run float32 on a CPU, and bfloat16 where its bf16 path runs: AVX-512
    BW/VL/DQ (or AVX-NE-CONVERT; on an AVX2-only CPU its weight reorder fails). `HEADSTART_CPU_ISA`
    restricts it as it restricts our kernels (avx2: no bfloat16 oneDNN), so an AVX-512 machine tests
    what an AVX2 one runs."""
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype not in ONEDNN_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    return param.dtype != torch.bfloat16 or _bf16_runs()


def _bf16_runs() -> bool:
    from headstart.kernels import cpu_isa

    try:
        level = cpu_isa.select()
    except (ValueError, cpu_isa.IsaUnavailable):
        return False
    return level.name != "avx2" and torch.ops.mkldnn._is_mkldnn_bf16_supported()
