"""The `native` kernel set: headstart's own kernel for forwards of a few tokens.

A decode step (and a typing forward of a few tokens) is bound by reading the
weights once. `native` runs every linear layer of such a forward through
`native_kernel` (kernels/native.cpp: each output row a dot product
streamed from memory, as llama.cpp's matrix-vector product is), and larger
forwards (prefill chunks, which are compute-bound) through oneDNN's packed
matmuls, as `onednn` does. The switch is on the forward's token count
(`NATIVE_MAX_TOKENS`, all rows of a batched forward together, by dtype).

Weights: q/k/v are fused into one matrix and gate/up into another (one call
reads a layer's weights), and the model's own projection weights are made
views of the fused ones, so the plain weights are held once (the oneDNN
packed copy is the second, as with `onednn`). The plain weights, the LM
head's included (tied to the embedding in Qwen2.5 0.5B-3B, and kept tied),
are copied into transparent huge pages (`huge_pages`: fewer TLB misses while
streaming them).

The LM head of a float32 model (Qwen2.5 0.5B's is 545 MB, over a quarter
of a decode step's bytes) runs as a `ScreenedHead` when the CPU has
AVX512-VNNI: an int8 copy (136 MB) screens the vocabulary, and only the rows
that could hold the argmax are recomputed in float32, so the greedy token
and its logit are the full head's bits (`screened_head`).

Exactness: the kernel sums every output element in one fixed order whatever
the token count, so up to `NATIVE_MAX_TOKENS` tokens a row's logits in a
batched forward equal its lone forward's bit for bit (tested), which the
matmul libraries do not promise. A forward above the threshold runs
oneDNN, whose blocking depends on M: as with `onednn`, equal up to float
reassociation. bfloat16 weights are widened to float32 in the kernel and
the sum kept in float32, rounded to bfloat16 once, as torch's bf16 linear.
"""

from __future__ import annotations

import torch

from headstart.engine.runner.ops.eager import EagerOps
from headstart.engine.runner.ops.onednn import OneDNNOps, PackedLinear, onednn_supports
from headstart.engine.runner.ops.huge_pages import huge_page_copies
from headstart.kernels.native import NativeKernel, load
from headstart.engine.runner.ops.screened_head import ScreenedHead, screens

# Forwards of at most this many tokens (all rows together) run the native
# kernel, by weight dtype: in float32 its blocked products beat oneDNN's packed
# GEMM up to a few dozen tokens, so typing rows riding with eight decode steps
# stay on it; in bfloat16 oneDNN multiplies natively and wins from a few
# tokens, and the bound stays where batched rows remain bit-identical to lone
# ones (`test_engine_native`). The timings: docs/benchmarks-archive.md,
# "The linear kernel".
NATIVE_MAX_TOKENS = {torch.float32: 48, torch.bfloat16: 8}


class NativeLinear:
    """One linear layer (several fused along the output axis): the native
    kernel up to `max_tokens` tokens, oneDNN's packed matmul above."""

    def __init__(self, kernel: NativeKernel, weight: torch.Tensor, packed: PackedLinear, max_tokens: int):
        """`weight`: the plain [N, K] matrix the kernel reads; `packed`: the
        same matrix packed for oneDNN, with the bias."""
        self.kernel, self.weight, self.packed, self.max_tokens = kernel, weight, packed, max_tokens
        self.bias_f32 = None if packed.bias is None else packed.bias.float().contiguous()
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > self.max_tokens:
            return self.packed(x)
        out = self.kernel.linear(flat.float().contiguous(), self.weight, self.bias_f32)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)


class NativeOps(OneDNNOps):
    """The linear layers through `NativeLinear` (module doc); the layer's
    steps around them are `OneDNNOps`' (the same fused matrices)."""

    name = "native"

    def __init__(self, model, max_tokens: int | None = None, packed: OneDNNOps | None = None,
                 screen_head: bool | None = None):
        """`max_tokens`: the largest forward the kernel runs (default: by the
        weights' dtype, `NATIVE_MAX_TOKENS`); `packed`: a `OneDNNOps` of this
        model whose packed weights to share (auto times both), else they are
        packed here; `screen_head`: the LM head through `ScreenedHead` (the
        same argmax from a quarter of the bytes; default: a float32 head
        without bias of at least `screened_head.SCREEN_MIN_BYTES`)."""
        EagerOps.__init__(self, model)  # not OneDNNOps': the packed weights come from `packed`
        kernel = self._kernel = load()
        if max_tokens is None:
            max_tokens = NATIVE_MAX_TOKENS[next(model.parameters()).dtype]
        packed = packed if packed is not None else OneDNNOps(model)
        self._qkv, self._o, self._gate_up, self._down = [], [], [], []
        # (modules fused into one matrix, their packed copy, the list it joins; None: the head)
        groups = []
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            groups += [((attn.q_proj, attn.k_proj, attn.v_proj), packed._qkv[i], self._qkv),
                       ((attn.o_proj,), packed._o[i], self._o),
                       ((mlp.gate_proj, mlp.up_proj), packed._gate_up[i], self._gate_up),
                       ((mlp.down_proj,), packed._down[i], self._down)]
        groups.append(((model.lm_head,), packed._head, None))
        # each fused matrix is written straight into the huge-page mapping (no temporary copy)
        fused = huge_page_copies([[m.weight.detach() for m in modules] for modules, _, _ in groups])
        for (modules, pack, target), weight in zip(groups, fused):
            _share(model, modules, weight)
            linear = NativeLinear(kernel, weight, pack, max_tokens)
            if target is None:
                # asked for (True): whatever its size; by default: from SCREEN_MIN_BYTES
                if screen_head is not False and screens(weight, pack.bias, kernel, 0 if screen_head else None):
                    linear = ScreenedHead(linear, store=lambda q: huge_page_copies([[q]])[0])
                self._head = linear
            else:
                target.append(linear)
        self._splits = packed._splits

    def attend_batch(self, q: torch.Tensor, rows, scale: float) -> torch.Tensor:
        """The few new tokens' causal attention of several rows of a batched
        forward in one kernel call (`row_attention.layer_attention`): q
        [tokens, heads, dim], the rows' tokens in turn; `rows` each row's
        (new tokens, cache pieces), the new keys last in the last piece;
        float32 [tokens, heads, dim] out. One call per layer instead of the
        dozen small ops of the general path (which cost a multi-token typing
        row riding in a decode forward more than its matrix products do), and
        instead of one call per row."""
        return self._kernel.attend_batch(q.float().contiguous(), rows, scale)


def _share(model, modules, fused: torch.Tensor) -> None:
    """Point each module's weight at its rows of the fused matrix (same
    values), so the model's own forward and ours read one copy; a weight tied
    to the embedding (the LM head of Qwen2.5 0.5B-3B) stays tied."""
    embed = model.model.embed_tokens
    at = 0
    for module in modules:
        rows = module.weight.shape[0]
        tied = module.weight is embed.weight
        module.weight = torch.nn.Parameter(fused[at:at + rows], requires_grad=False)
        if tied:
            embed.weight = module.weight
        at += rows


def native_supports(model) -> str | None:
    """None when `native` can run this model, else why not."""
    from headstart.kernels.native import unavailable_reason

    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype not in (torch.float32, torch.bfloat16):
        return "the native kernel runs float32 and bfloat16 on a CPU"
    if not onednn_supports(model):
        return "no oneDNN kernels for this dtype here (the forwards above the native kernel's token count)"
    return unavailable_reason()
