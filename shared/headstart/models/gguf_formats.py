"""GGUF's quantized block formats as integer groups: what the kernels serve.

A GGUF matrix [N, K] (nn.Linear's layout: N output rows, K contiguous) is
stored in blocks along K. Every format the Qwen2.5-Coder GGUF files use is,
exactly, small unsigned integers times a per-group float scale (less a
per-group minimum for Q4_K):

| GGUF type | block | serving form (`IntGroups`) | value |
|---|---|---|---|
| Q8_0 | 32: fp16 d, 32 int8 | u = q + 128 (8 bits), group 32 | d * (u - 128) |
| Q5_0 | 32: fp16 d, 32 5-bit | u in 0..31, group 32 | d * (u - 16) |
| Q6_K | 256: 16 int8 sub-scales, fp16 d, 6-bit | u in 0..63, group 16 | (d * sc) * (u - 32) |
| Q4_K | 256: 8 6-bit scales/mins, fp16 d, dmin, 4-bit | u in 0..15, group 32, min | (d * sc) * u - dmin * m |

Every scale and minimum is a product of an fp16 and an integer of at most 8
bits, exact in float32, so `IntGroups.dequantize()` gives the very floats
ggml's own dequantization gives (tested against the `gguf` package's):
the re-quantization keeps the GGUF's values, none is rounded again.

The decoders here are plain numpy over whole tensors (they run once, at
load); `rows()` decodes only the rows it is asked for (the embedding's
lookups, straight from the memory-mapped file).
"""

from __future__ import annotations

import numpy as np

from headstart.kernels.packing import IntGroups

# ggml's type ids (ggml.h: enum ggml_type) and their block sizes: (elements, bytes)
F32, F16, Q8_0, Q5_0, Q4_K, Q6_K, BF16 = 0, 1, 8, 6, 12, 14, 30
BLOCKS = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q8_0: (32, 34), Q5_0: (32, 22), Q4_K: (256, 144),
          Q6_K: (256, 210)}
NAMES = {F32: "F32", F16: "F16", BF16: "BF16", Q8_0: "Q8_0", Q5_0: "Q5_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
QUANTIZED = (Q8_0, Q5_0, Q4_K, Q6_K)


class UnsupportedFormat(ValueError):
    """A tensor type this server has no kernel for (the message names it and the ones it has)."""


def _fp16(raw: np.ndarray) -> np.ndarray:
    """Little-endian fp16 bytes [..., 2] -> float32 [...]."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _blocks(data: np.ndarray, ggml_type: int, k: int) -> np.ndarray:
    """The raw bytes [N, row bytes] of a matrix as [N, K / block, block bytes]."""
    elems, size = BLOCKS[ggml_type]
    if k % elems:
        raise UnsupportedFormat(f"{NAMES[ggml_type]} needs rows of a multiple of {elems} elements, got {k}")
    n = data.shape[0]
    return np.ascontiguousarray(data).reshape(n, k // elems, size)


def decode_q8_0(data: np.ndarray, k: int) -> IntGroups:
    b = _blocks(data, Q8_0, k)
    d = _fp16(b[..., 0:2].reshape(*b.shape[:2], 2))
    q = (b[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return IntGroups("q8_0", q.reshape(b.shape[0], k), d)


def decode_q5_0(data: np.ndarray, k: int) -> IntGroups:
    b = _blocks(data, Q5_0, k)
    d = _fp16(b[..., 0:2].reshape(*b.shape[:2], 2))
    qh = b[..., 2:6].copy().view(np.uint32)[..., 0]  # [N, blocks]: bit j = high bit of element j
    qs = b[..., 6:22]  # [N, blocks, 16]: element j < 16 in the low nibble of byte j, j >= 16 in the high one
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [N, blocks, 32]
    high = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    q = low | (high << 4)
    return IntGroups("q5_0", q.reshape(b.shape[0], k), d)


def _k4_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of packed 6-bit scales and mins -> two uint8 [..., 8] (ggml's get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def decode_q4_k(data: np.ndarray, k: int) -> IntGroups:
    b = _blocks(data, Q4_K, k)
    n, nb = b.shape[:2]
    d = _fp16(b[..., 0:2].reshape(n, nb, 2))
    dmin = _fp16(b[..., 2:4].reshape(n, nb, 2))
    sc, mn = _k4_scales_mins(b[..., 4:16])
    qs = b[..., 16:144].reshape(n, nb, 4, 32)  # four 64-element chunks: sub-block 2j low nibbles, 2j+1 high
    q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, nb, 256)
    # the scale d * sc and the minimum dmin * m of each group (float32 products, as ggml computes them)
    return IntGroups("q4_k", q.reshape(n, k), d, sc.reshape(n, k // 32), dmin, mn.reshape(n, k // 32))


def decode_q6_k(data: np.ndarray, k: int) -> IntGroups:
    b = _blocks(data, Q6_K, k)
    n, nb = b.shape[:2]
    ql = b[..., 0:128].reshape(n, nb, 2, 64)
    qh = b[..., 128:192].reshape(n, nb, 2, 32)
    sc = b[..., 192:208].view(np.int8).reshape(n, nb, 16)
    d = _fp16(b[..., 208:210].reshape(n, nb, 2))
    lo, hi = ql[..., :32], ql[..., 32:]
    parts = [(lo & 0x0F) | ((qh & 3) << 4), (hi & 0x0F) | (((qh >> 2) & 3) << 4),
             (lo >> 4) | (((qh >> 4) & 3) << 4), (hi >> 4) | (((qh >> 6) & 3) << 4)]
    q = np.concatenate(parts, axis=-1).reshape(n, nb, 256)  # each half: elements l, l+32, l+64, l+96
    return IntGroups("q6_k", q.reshape(n, k).astype(np.uint8), d, sc.reshape(n, k // 16).copy())


DECODERS = {Q8_0: decode_q8_0, Q5_0: decode_q5_0, Q4_K: decode_q4_k, Q6_K: decode_q6_k}


def decode(data: np.ndarray, ggml_type: int, k: int) -> IntGroups:
    """A quantized GGUF matrix (raw bytes [N, row bytes]) as `IntGroups`.
    Raises `UnsupportedFormat` for a type without a kernel."""
    if ggml_type not in DECODERS:
        raise UnsupportedFormat(f"no kernel for GGUF tensor type {NAMES.get(ggml_type, ggml_type)}; "
                                f"supported: {', '.join(NAMES[t] for t in QUANTIZED)}")
    return DECODERS[ggml_type](data, k)


def dequantize_rows(data: np.ndarray, ggml_type: int, k: int, rows: np.ndarray) -> np.ndarray:
    """float32 [len(rows), K]: the given rows of a matrix in any supported
    type (quantized ones decoded, F16/BF16 widened), reading only those rows."""
    picked = data[rows]
    if ggml_type == F32:
        return np.ascontiguousarray(picked).view(np.float32).reshape(len(rows), k).copy()
    if ggml_type == F16:
        return np.ascontiguousarray(picked).view(np.float16).reshape(len(rows), k).astype(np.float32)
    if ggml_type == BF16:
        raw = np.ascontiguousarray(picked).view(np.uint16).reshape(len(rows), k).astype(np.uint32) << 16
        return raw.view(np.float32)
    return decode(picked, ggml_type, k).dequantize()
