"""Tiny qwen2 GGUF files for tests, written with ggml's own `gguf` package.

Real shapes are too slow to make per test; these have the Qwen2.5 vocabulary
(so the tokenizer fits) and tiny layers, with every quantized type the
server reads: Q8_0 and Q5_0 quantized by `gguf` from random floats, Q4_K and
Q6_K as random blocks with sane fp16 scales (`gguf` has no K-quant quantizer;
any bytes are a valid block).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 151936
# (name, tensor) types per layer: a Q8_0/Q5_0 mix in attention, K-quants in the MLP
LAYER_TYPES = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q5_0",
               "ffn_gate": "Q5_0", "ffn_up": "Q8_0", "ffn_down": "Q4_K"}


def _kquant_blocks(rng, rows: int, k: int, kind: str) -> np.ndarray:
    """Random Q4_K / Q6_K blocks for a [rows, k] matrix, with d (and dmin) of ~0.001-0.01."""
    from gguf.quants import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType[kind]
    elems, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, k // elems, size), dtype=np.uint8)
    scale = rng.uniform(0.001, 0.01, size=(rows, k // elems)).astype(np.float16).view(np.uint8).reshape(
        rows, k // elems, 2)
    if kind == "Q4_K":  # d, dmin at bytes 0-3
        blocks[..., 0:2] = scale
        blocks[..., 2:4] = scale
    else:  # Q6_K: d at the last two bytes
        blocks[..., size - 2:size] = scale
    return blocks.reshape(rows, -1)


def write_tiny_qwen2(path: Path, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
                     kv_heads: int = 2, inter: int = 256, tied: bool = False) -> Path:
    """A complete qwen2 GGUF model file at `path` (about 15 MB: the vocabulary's embedding)."""
    import gguf
    from gguf.quants import GGMLQuantizationType, quantize

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_eos_token_id(151645)
    writer.add_bos_token_id(151643)

    def matrix(name: str, rows: int, k: int, kind: str, std: float = 0.2) -> None:
        qtype = GGMLQuantizationType[kind]
        if kind in ("Q4_K", "Q6_K"):
            raw = _kquant_blocks(rng, rows, k, kind)
        else:
            raw = quantize(rng.normal(0, std, size=(rows, k)).astype(np.float32), qtype)
        writer.add_tensor(name, raw, raw_dtype=qtype)  # raw: [rows, row bytes]

    def vector(name: str, n: int, center: float = 0.0) -> None:
        writer.add_tensor(name, (center + rng.normal(0, 0.1, size=n)).astype(np.float32))

    dim = hidden // heads
    matrix("token_embd.weight", VOCAB, hidden, "Q8_0", std=1.0)
    if not tied:
        matrix("output.weight", VOCAB, hidden, "Q8_0")
    vector("output_norm.weight", hidden, 1.0)
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv_heads * dim, hidden), "attn_v": (kv_heads * dim, hidden),
              "attn_output": (hidden, hidden), "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden),
              "ffn_down": (hidden, inter)}
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden, 1.0)
        vector(f"blk.{i}.ffn_norm.weight", hidden, 1.0)
        for part in ("attn_q", "attn_k", "attn_v"):
            vector(f"blk.{i}.{part}.bias", shapes[part][0])
        for part, kind in LAYER_TYPES.items():
            k = shapes[part][1]
            if kind in ("Q4_K", "Q6_K") and k % 256:
                kind = "Q8_0"  # K-quants need k a multiple of 256: the tiny hidden (64) is not
            if part == "ffn_down":
                kind = ("Q6_K", "Q4_K")[i % 2]  # k = inter: both K-quants, one per layer
            matrix(f"blk.{i}.{part}.weight", *shapes[part], kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
