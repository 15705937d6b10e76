"""`onednn`: the linear layers as oneDNN packed matmuls.

The weights are reordered once into oneDNN's blocked layout, q/k/v fused
into one matrix and gate/up into another, so one call reads each layer's
weights. Any token count, no compile; float32 and bfloat16 (other dtypes
keep the `off` ops). PyTorch's default float32 GEMV (MKL) reads about a
third of the memory bandwidth llama.cpp's does on the machines we measure
on (docs/benchmarks-archive.md), which is why this set exists.
"""

from __future__ import annotations

import torch

from headstart.engine.runner.ops.eager import EagerOps

ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


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
