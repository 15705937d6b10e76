"""The module tree a GGUF model is served with: Qwen2's layout, no Hugging Face modeling code.

Serving a GGUF model never runs a Hugging Face forward: every forward goes
through the runner's quantized kernels (`engine.quant_ops`), which read each
layer's weights from this tree (norms, projections, the embedding, the head,
the rotary table). Building it as transformers' `Qwen2ForCausalLM` imported
the whole of transformers' modeling stack (torch._dynamo, the ONNX exporter,
sympy, PIL: about 88 MiB of a replica's resident memory, issue 32) for
classes whose forward the replica never ran. The tree keeps Hugging Face's
attribute names (`model.model.layers[i].self_attn.q_proj`, `.mlp.down_proj`,
`.input_layernorm`, `model.model.rotary_emb`, `model.lm_head`), so code that
reads a model's weights reads either kind.

The norm, the rotary table and the rotary function compute what
transformers' `Qwen2RMSNorm`, `Qwen2RotaryEmbedding` (default RoPE) and
`apply_rotary_pos_emb` compute, op for op, so their bits are the same
(tested against them).

The few callers that need transformers' modules on such a model (table-block
precompute, which runs the runner's loop with the model's own modules rather
than the quantized kernels; `model(input_ids=...)` in tests) get them:
`hf_view()` builds, on first use, a `Qwen2ForCausalLM` around these very
modules, importing transformers' modeling code only then.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """transformers' `Qwen2RMSNorm`: w * x / sqrt(mean(x^2) + eps), computed in float32."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class RotaryEmbedding(nn.Module):
    """transformers' `Qwen2RotaryEmbedding` with default RoPE: (cos, sin) of positions x inv_freq."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0  # default RoPE scales nothing

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' `rotate_half`: the last dim's halves swapped, the first negated."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' `apply_rotary_pos_emb`, op for op: RoPE on q and k. The model's own rotary
    function, where code that rotates keys outside a forward looks it up (`tables.rope`: table
    blocks placed at new positions, a data session's shift retention) by the attention class's
    module, as it does in transformers' modeling modules."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class Attention(nn.Module):
    """A layer's attention weights (the kernels compute the attention itself)."""

    def __init__(self, q_proj: nn.Module, k_proj: nn.Module, v_proj: nn.Module, o_proj: nn.Module, head_dim: int):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.head_dim = head_dim
        self.scaling = head_dim ** -0.5


class Mlp(nn.Module):
    """A layer's SwiGLU weights."""

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj


class DecoderLayer(nn.Module):
    def __init__(self, self_attn: Attention, mlp: Mlp, input_layernorm: RMSNorm, post_attention_layernorm: RMSNorm):
        super().__init__()
        self.self_attn, self.mlp = self_attn, mlp
        self.input_layernorm, self.post_attention_layernorm = input_layernorm, post_attention_layernorm


class Decoder(nn.Module):
    def __init__(self, embed_tokens: nn.Module, layers: list[DecoderLayer], norm: RMSNorm, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.embed_tokens, self.norm, self.rotary_emb = embed_tokens, norm, rotary_emb
        self.layers = nn.ModuleList(layers)


class GgufCausalLM(nn.Module):
    """A GGUF model as the engine serves it: `config` (a `Qwen2Config`), `generation_config`,
    `model` (the decoder) and `lm_head` (module doc)."""

    def __init__(self, config, decoder: Decoder, lm_head: nn.Module, generation_config):
        super().__init__()
        self.config, self.generation_config = config, generation_config
        self.model, self.lm_head = decoder, lm_head
        self.__dict__["_hf_view"] = None  # not a submodule: the same modules, seen by transformers

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32  # the activations' (the weights are integer groups)

    def hf_view(self):
        """transformers' `Qwen2ForCausalLM` around this tree's modules (built once, on first use)."""
        if self.__dict__["_hf_view"] is None:
            self.__dict__["_hf_view"] = _hf_view(self)
        return self.__dict__["_hf_view"]

    def forward(self, *args, **kwargs):
        """transformers' forward (`hf_view`); the engine's forwards run the kernels instead."""
        return self.hf_view()(*args, **kwargs)


def _hf_view(model: GgufCausalLM):
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        view = Qwen2ForCausalLM(model.config)
    for ours, theirs in zip(model.model.layers, view.model.layers):
        theirs.input_layernorm, theirs.post_attention_layernorm = ours.input_layernorm, ours.post_attention_layernorm
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(theirs.self_attn, name, getattr(ours.self_attn, name))
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(theirs.mlp, name, getattr(ours.mlp, name))
    view.model.embed_tokens, view.model.norm = model.model.embed_tokens, model.model.norm
    view.model.rotary_emb = model.model.rotary_emb
    view.lm_head = model.lm_head
    view.generation_config = model.generation_config
    left = [name for name, p in view.named_parameters() if p.is_meta] + [
        name for name, b in view.named_buffers() if b.is_meta]
    if left:
        raise RuntimeError(f"the Hugging Face view of the GGUF model lacks {', '.join(left[:5])}")
    return view.eval()
