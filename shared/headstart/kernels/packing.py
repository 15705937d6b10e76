"""Quantized matrices: as integer groups (`IntGroups`), and in the kernels' blocked layout.

`IntGroups` is the form every supported GGUF block format decodes to
(`headstart.models.gguf_formats`). `pack(groups)` turns it into `PackedMatrix`: rows in blocks of 16,
each block's bytes ordered 4 k at a time for the 16 rows (one 64-byte
vector: one VNNI dot-product instruction gives the 16 rows' sums), 4-bit
values two to a byte, scales and minimums [blocks][groups][16]. The values
are not changed: `unpack()` gives the `IntGroups` back, and the kernel's
result is that of the GGUF's own values (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


ROWS = 16
# A byte above this could overflow maddubs' int16 pair sums (2 * 129 * 127 < 2^15): such
# blocks (Q8_0's q + 128) take the sign form on AVX2 and on AVX-512 without VNNI.
NARROW_MAX = 128


@dataclass
class IntGroups:
    """A matrix [N, K] as unsigned integers in groups along K.

    value[n, k] = scale[n, k // group] * (q[n, k] - offset) - (minimum[n, k // group] if minimum else 0)

    `bits` is 8 (q in 0..255) or 4 (q in 0..15); `offset` is one integer for
    the whole matrix (0 where `minimum` is set)."""

    q: np.ndarray  # uint8 [N, K]
    scale: np.ndarray  # float32 [N, K // group]
    group: int
    offset: int
    bits: int
    minimum: np.ndarray | None = None  # float32 [N, K // group]

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], ggml's values."""
        n, k = self.q.shape
        scale = np.repeat(self.scale, self.group, axis=1)
        out = scale * (self.q.astype(np.float32) - np.float32(self.offset))
        if self.minimum is not None:
            out -= np.repeat(self.minimum, self.group, axis=1)
        return out.astype(np.float32)


@dataclass
class PackedMatrix:
    """One matrix [n, k] in the kernel layout (tensors own the memory the kernel reads)."""

    data: torch.Tensor  # uint8, blocks
    scale: torch.Tensor  # float32 [n/16, groups, 16]
    minimum: torch.Tensor | None  # float32, like scale (4-bit)
    offset: torch.Tensor | None  # float32 [n/16, 16] (8-bit)
    wide: torch.Tensor | None  # uint8 [n/16] (8-bit)
    bias: torch.Tensor | None  # float32 [n]
    n: int  # rows, padded to a multiple of 16
    n_real: int  # rows of the source matrix
    k: int
    group: int
    bits: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scale, self.minimum, self.offset,
                                                           self.wide, self.bias) if t is not None)

    def with_bias(self, bias: torch.Tensor | None) -> "PackedMatrix":
        if bias is None:
            return self
        padded = torch.zeros(self.n, dtype=torch.float32)
        padded[: self.n_real] = bias.float()
        return PackedMatrix(self.data, self.scale, self.minimum, self.offset, self.wide, padded, self.n, self.n_real,
                            self.k, self.group, self.bits)


def _blocked(values: np.ndarray, n: int, groups: int) -> np.ndarray:
    """[n, groups] per-row-per-group floats -> [n/16, groups, 16]."""
    return np.ascontiguousarray(values.reshape(n // ROWS, ROWS, groups).transpose(0, 2, 1), dtype=np.float32)


def pack(groups: IntGroups, bias: np.ndarray | torch.Tensor | None = None) -> PackedMatrix:
    """`groups` in the kernel layout. Raises ValueError for a shape the kernels cannot run
    (k not a multiple of 32, a group other than 16/32, 4-bit without a minimum)."""
    q = groups.q
    n_real, k = q.shape
    if k % 32:
        raise ValueError(f"quantized matrices need k a multiple of 32, got {k}")
    if groups.bits == 8 and groups.group not in (16, 32) or groups.bits == 4 and groups.group != 32:
        raise ValueError(f"no kernel for {groups.bits}-bit groups of {groups.group}")
    if groups.bits == 4 and groups.minimum is None:
        raise ValueError("4-bit groups need a minimum")
    n = -(-n_real // ROWS) * ROWS
    scale, minimum = groups.scale, groups.minimum
    if n != n_real:  # zero rows: value scale * (offset - offset) = 0
        q = np.concatenate([q, np.full((n - n_real, k), groups.offset, np.uint8)])
        scale = np.concatenate([scale, np.zeros((n - n_real, scale.shape[1]), np.float32)])
        if minimum is not None:
            minimum = np.concatenate([minimum, np.zeros((n - n_real, minimum.shape[1]), np.float32)])
    ng = k // groups.group
    if groups.bits == 8:
        data = q.reshape(n // ROWS, ROWS, k // 4, 4).transpose(0, 2, 1, 3)  # [blocks, k/4, 16, 4]
        block_max = q.reshape(n // ROWS, -1).max(axis=1)
        wide = (block_max > NARROW_MAX).astype(np.uint8)
        if wide.any() and groups.offset != 128:
            raise ValueError("8-bit values above 128 need the offset 128 (int8 stored as q + 128)")
        offset = torch.full((n // ROWS, ROWS), float(groups.offset), dtype=torch.float32)
        wide_t = torch.from_numpy(wide)
        mins = None
    else:
        chunks = q.reshape(n // ROWS, ROWS, k // 8, 2, 4)  # [blocks, 16, k/8, (low, high), 4]
        data = (chunks[:, :, :, 0] | (chunks[:, :, :, 1] << 4)).transpose(0, 2, 1, 3)  # [blocks, k/8, 16, 4]
        offset = wide_t = None
        mins = torch.from_numpy(_blocked(minimum, n, ng))
    packed = PackedMatrix(torch.from_numpy(np.ascontiguousarray(data, dtype=np.uint8)).reshape(-1),
                          torch.from_numpy(_blocked(scale, n, ng)), mins, offset, wide_t, None, n, n_real, k,
                          groups.group, groups.bits)
    return packed.with_bias(None if bias is None else torch.as_tensor(bias))


def unpack(packed: PackedMatrix) -> IntGroups:
    """The `IntGroups` a `PackedMatrix` holds (tests; the source's rows only)."""
    n, k = packed.n, packed.k
    raw = packed.data.numpy()
    if packed.bits == 8:
        q = raw.reshape(n // ROWS, k // 4, ROWS, 4).transpose(0, 2, 1, 3).reshape(n, k)
        offset = int(packed.offset[0, 0])
    else:
        blocks = raw.reshape(n // ROWS, k // 8, ROWS, 4)
        low, high = blocks & 0x0F, blocks >> 4
        q = np.stack([low, high], axis=2).transpose(0, 3, 1, 2, 4).reshape(n, k)
        offset = 0
    ng = k // packed.group

    def rows(t):
        return t.numpy().transpose(0, 2, 1).reshape(n, ng)[: packed.n_real]

    return IntGroups(np.ascontiguousarray(q[: packed.n_real]), rows(packed.scale), packed.group, offset, packed.bits,
                     None if packed.minimum is None else rows(packed.minimum))
