"""A GGUF file (Qwen2 architecture) as a served model whose weights stay quantized.

`load_gguf_model(path)` reads the file's metadata into a `Qwen2Config` and
builds the served module tree (`models.gguf_decoder`: Qwen2's layout without
transformers' modeling code) from the file's tensors: each projection and the LM head a
`QuantLinear` (the GGUF's own integers, packed once for the kernels), the
embedding a `QuantEmbedding` (rows read from the memory-mapped file), norms
and biases as float32. Loading the 0.5B takes a few seconds (packing is
numpy over the integers; nothing is dequantized).

Only the `qwen2` architecture is served (the Qwen2.5 family); another
architecture, a tensor type without a kernel, or a file that is not GGUF is
a `GgufError` that says which.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from headstart.kernels.quant import QuantKernel
from headstart.kernels.packing import PackedMatrix, pack
from headstart.models.gguf_decoder import Attention, Decoder, DecoderLayer, GgufCausalLM, Mlp, RMSNorm, RotaryEmbedding
from headstart.models.gguf_file import GgufFormatError, GgufHeader, TensorInfo
from headstart.models.gguf_formats import F32, NAMES, QUANTIZED, UnsupportedFormat, decode
from headstart.models.quantized import QuantEmbedding, QuantLinear

log = logging.getLogger(__name__)

ARCHITECTURES = ("qwen2",)


class GgufError(ValueError):
    """The file is not a GGUF model this server can run (the message says why)."""


class GgufFile(GgufHeader):
    """A GGUF model file: its metadata, its tensors as the server uses them."""

    def __init__(self, path: Path):
        try:
            super().__init__(path)
        except GgufFormatError as exc:
            raise GgufError(str(exc)) from exc

    def require(self, key: str):
        value = self.value(key)
        if value is None:
            raise GgufError(f"{self.path} lacks the metadata key {key!r}")
        return value

    def tensor(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise GgufError(f"{self.path} lacks the tensor {name!r}")
        return self.tensors[name]

    def floats(self, name: str) -> torch.Tensor:
        """A 1-D F32 tensor (norm weights, biases) as a float32 tensor (copied out of the map)."""
        t = self.tensor(name)
        if t.ggml_type != F32:
            raise GgufError(f"{name} is {NAMES.get(t.ggml_type, t.ggml_type)}, expected F32")
        return torch.from_numpy(np.array(t.data).view(np.float32).reshape(-1))

    def matrix(self, name: str, bias: torch.Tensor | None = None) -> PackedMatrix:
        """A quantized 2-D tensor, packed for the kernels."""
        t = self.tensor(name)
        ggml_type = t.ggml_type
        if ggml_type not in QUANTIZED:
            raise GgufError(f"{name} is {NAMES.get(ggml_type, ggml_type)}: only quantized matrices "
                            f"({', '.join(NAMES[q] for q in QUANTIZED)}) are served")
        try:
            return pack(decode(t.data, ggml_type, t.row_length), bias)
        except UnsupportedFormat as exc:
            raise GgufError(f"{name}: {exc}") from exc


def qwen2_config(file: GgufFile) -> dict:
    """The `Qwen2Config` fields a GGUF file's metadata gives."""
    arch = file.require("general.architecture")
    if arch not in ARCHITECTURES:
        raise GgufError(f"{file.path} holds a {arch!r} model; served: {', '.join(ARCHITECTURES)}")
    embed = file.tensor("token_embd.weight")
    hidden, vocab = embed.shape
    heads = int(file.require(f"{arch}.attention.head_count"))
    eos = file.value("tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": int(file.require(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(file.require(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(file.require(f"{arch}.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "max_position_embeddings": int(file.require(f"{arch}.context_length")),
        "rope_theta": float(file.require(f"{arch}.rope.freq_base")),
        "rms_norm_eps": float(file.require(f"{arch}.attention.layer_norm_rms_epsilon")),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "bos_token_id": int(file.value("tokenizer.ggml.bos_token_id", 151643)),
        "eos_token_id": int(eos) if eos is not None else 151645,
    }


def load_gguf_model(path: Path, kernel: QuantKernel) -> GgufCausalLM:
    """The model in `path` with quantized weights (module doc). Raises `GgufError`."""
    from transformers import GenerationConfig, Qwen2Config

    started = time.perf_counter()
    file = GgufFile(path)
    fields = qwen2_config(file)
    config = Qwen2Config(**fields)
    config._attn_implementation = "sdpa"  # for `hf_view`'s forward
    head_dim = fields["head_dim"]

    def norm(name: str) -> RMSNorm:
        return RMSNorm(file.floats(name), config.rms_norm_eps)

    def linear(name: str, bias: str | None = None) -> QuantLinear:
        return QuantLinear(kernel, file.matrix(name, file.floats(bias) if bias else None))

    layers = []
    for i in range(config.num_hidden_layers):
        b = f"blk.{i}."
        attn = Attention(linear(b + "attn_q.weight", b + "attn_q.bias"), linear(b + "attn_k.weight", b + "attn_k.bias"),
                         linear(b + "attn_v.weight", b + "attn_v.bias"), linear(b + "attn_output.weight"),
                         head_dim)
        mlp = Mlp(linear(b + "ffn_gate.weight"), linear(b + "ffn_up.weight"), linear(b + "ffn_down.weight"))
        layers.append(DecoderLayer(attn, mlp, norm(b + "attn_norm.weight"), norm(b + "ffn_norm.weight")))
    embed = file.tensor("token_embd.weight")
    # rows read from a map of the embedding alone: the whole file's map goes with `file`, and with it
    # the ~0.5 GB of file pages packing read (they would count in this process's RSS)
    embed_tokens = QuantEmbedding(file.own_map("token_embd.weight"), embed.ggml_type, config.vocab_size,
                                  config.hidden_size)
    decoder = Decoder(embed_tokens, layers, norm("output_norm.weight"),
                      RotaryEmbedding(head_dim, fields["rope_theta"]))
    # a tied head (Qwen2.5 1.5B/3B) is the embedding's matrix, packed for the kernels
    lm_head = linear("token_embd.weight" if config.tie_word_embeddings else "output.weight")
    generation = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id)
    model = GgufCausalLM(config, decoder, lm_head, generation).eval()
    log.info("loaded %s (%s kernels) in %.1f s: %.0f MB of packed weights", path, kernel.name,
             time.perf_counter() - started, packed_bytes(model) / 1e6)
    return model


def packed_bytes(model) -> int:
    """Bytes the model's quantized matrices hold in memory."""
    return sum(m.matrix.nbytes for m in model.modules() if isinstance(m, QuantLinear))
