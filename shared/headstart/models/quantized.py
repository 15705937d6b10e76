"""Modules that hold a GGUF model's weights in their quantized form and compute with the kernels.

`QuantLinear` stands where a Hugging Face model has an `nn.Linear`
(`models.gguf_decoder`'s tree, and its `hf_view`): its weight
stays in the GGUF's integers (`engine.quant_weights.PackedMatrix`) and every
call runs the quantized kernels (`engine.quant_kernel`), so the model's own
forward, the engine's runner and every mode of the engine compute the same
products. `QuantEmbedding` looks rows up straight in the memory-mapped GGUF
file: the embedding table is never widened to float32 (the pages of the
tokens used are all that is read).
"""

from __future__ import annotations

import numpy as np
import torch

from headstart.kernels.quant import FusedSegments, QuantKernel
from headstart.kernels.packing import PackedMatrix
from headstart.models.gguf_formats import dequantize_rows


class QuantLinear(torch.nn.Module):
    """y = x W^T (+ b) with W quantized: float32 in, float32 out."""

    def __init__(self, kernel: QuantKernel, matrix: PackedMatrix):
        super().__init__()
        self.kernel, self.matrix = kernel, matrix
        self.segments = FusedSegments([matrix])
        self.in_features, self.out_features = matrix.k, matrix.n_real

    @property
    def bias(self) -> torch.Tensor | None:
        """The bias the kernel adds (transformers' code reads `.bias` of a projection)."""
        return None if self.matrix.bias is None else self.matrix.bias[: self.matrix.n_real]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        return self.kernel.linear(flat, self.segments).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        m = self.matrix
        return f"in={m.k}, out={m.n_real}, {m.kind} ({m.format.bits}-bit), kernels={self.kernel.name}"


class QuantEmbedding(torch.nn.Module):
    """Token embeddings read from the GGUF tensor's raw rows (any supported type) as float32."""

    def __init__(self, raw_rows: np.ndarray, ggml_type: int, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.raw_rows, self.ggml_type = raw_rows, ggml_type  # [vocab, row bytes], memory-mapped
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu().numpy()
        if flat.size and (flat.min() < 0 or flat.max() >= self.num_embeddings):
            raise IndexError(f"token id out of range [0, {self.num_embeddings})")
        rows = dequantize_rows(self.raw_rows, self.ggml_type, self.embedding_dim, flat)
        return torch.from_numpy(rows).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, read from the GGUF file"


def is_quantized(model) -> bool:
    """Whether `model`'s projections are `QuantLinear`s (a GGUF model served quantized)."""
    return isinstance(getattr(model, "lm_head", None), QuantLinear)
