"""Quantized matrices: as integer groups (`IntGroups`), and in the kernels' blocked layout.

`IntGroups` is the form every supported GGUF block format decodes to
(`headstart.models.gguf_formats`): unsigned integers, a scale per group
(and a minimum for Q4_K) kept as the format factors it, an fp16 per
super-block times a small integer per group (`FORMATS`). `pack(groups)`
turns it into `PackedMatrix`, at the GGUF's own bit widths:

- rows in blocks of 16; along k, units of 32: per unit, 8 chunks of 4 k for
  the block's 16 rows (64 bytes: one VNNI dot-product instruction gives the
  16 rows' sums, no horizontal reduction);
- 8-bit values (Q8_0) as bytes (512 bytes a unit); 4- to 6-bit values as
  nibbles, two chunks to 64 bytes (256 bytes), then their bits above the
  nibble (1 for 5-bit values, 2 for 6-bit) as fields of bytes laid out as a
  chunk is: byte p of a 64-byte field group holds, at bits w*j .. w*j+w-1,
  the high bits of value p of chunk g*(8/w) + j (5 bits: one group, 8 chunks
  a byte; 6 bits: two groups, 4 chunks a byte). A chunk's high bits are then
  one load, one shift and one mask on every instruction set;
- scale factors: fp16 [blocks][super-blocks][16], integers [blocks][groups][16].

So a unit of Q5_0 takes 5.5 bits a weight, Q6_K 6.6, Q4_K 4.6, Q8_0 8.5:
what the file takes. The values are not changed: `unpack()` gives the
`IntGroups` back, and the kernel's result is that of the GGUF's own
values (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ROWS = 16
UNIT = 32  # k per unit
# A byte above this could overflow maddubs' int16 pair sums (2 * 129 * 127 < 2^15): such
# blocks (Q8_0's q + 128) take the sign form on AVX2 and on AVX-512 without VNNI.
NARROW_MAX = 128


@dataclass(frozen=True)
class Format:
    """value = d[super-block] * sc[group] * (q - offset) - dmin[super-block] * m[group]
    (sc = 1 where the format has no per-group integer: the group is the super-block)."""

    code: int  # the kernels' kind number (kernels/quant.cpp)
    bits: int  # of a value
    group: int
    superblock: int
    offset: int
    has_scale_ints: bool
    has_minimum: bool

    @property
    def unit_bytes(self) -> int:
        """Bytes of one 32-k unit of a 16-row block."""
        return {8: 512, 4: 256, 5: 320, 6: 384}[self.bits]


FORMATS = {
    "q8_0": Format(0, 8, 32, 32, 128, False, False),
    "q5_0": Format(1, 5, 32, 32, 16, False, False),
    "q6_k": Format(2, 6, 16, 256, 32, True, False),
    "q4_k": Format(3, 4, 32, 256, 0, True, True),
}


@dataclass
class IntGroups:
    """A matrix [N, K] as unsigned integers in groups along K (`FORMATS[kind]`).

    `d` float32 [N, K / superblock] (fp16 values); `sc` int [N, K / group] or None; for
    Q4_K `dmin` and `m` likewise."""

    kind: str
    q: np.ndarray  # uint8 [N, K]
    d: np.ndarray
    sc: np.ndarray | None = None
    dmin: np.ndarray | None = None
    m: np.ndarray | None = None

    @property
    def format(self) -> Format:
        return FORMATS[self.kind]

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    @property
    def group(self) -> int:
        return self.format.group

    @property
    def offset(self) -> int:
        return self.format.offset

    def _per_group(self, d: np.ndarray, ints: np.ndarray | None) -> np.ndarray:
        if ints is None:
            return d.astype(np.float32)
        per = self.format.superblock // self.format.group
        return (np.repeat(d, per, axis=1) * ints.astype(np.float32)).astype(np.float32)  # exact: fp16 x 8-bit int

    @property
    def scale(self) -> np.ndarray:
        """float32 [N, K / group]: each group's scale (d x sc, as ggml computes it)."""
        return self._per_group(self.d, self.sc)

    @property
    def minimum(self) -> np.ndarray | None:
        return None if self.dmin is None else self._per_group(self.dmin, self.m)

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], ggml's values."""
        g = self.format.group
        out = np.repeat(self.scale, g, axis=1) * (self.q.astype(np.float32) - np.float32(self.format.offset))
        if self.dmin is not None:
            out -= np.repeat(self.minimum, g, axis=1)
        return out.astype(np.float32)


@dataclass
class PackedMatrix:
    """One matrix [n, k] in the kernel layout (tensors own the memory the kernel reads)."""

    kind: str
    data: torch.Tensor  # uint8, the blocks' units
    d: torch.Tensor  # fp16 bits (int16) [n/16, k/superblock, 16]
    sc: torch.Tensor | None  # int8 (q6_k) / uint8 (q4_k) [n/16, k/group, 16]
    dmin: torch.Tensor | None
    m: torch.Tensor | None
    wide: torch.Tensor  # uint8 [n/16]: 1 where a block holds bytes above NARROW_MAX
    bias: torch.Tensor | None  # float32 [n]
    n: int  # rows, padded to a multiple of 16
    n_real: int  # rows of the source matrix
    k: int

    @property
    def format(self) -> Format:
        return FORMATS[self.kind]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.d, self.sc, self.dmin, self.m, self.wide,
                                                           self.bias) if t is not None)

    def with_bias(self, bias: torch.Tensor | None) -> "PackedMatrix":
        if bias is None:
            return self
        padded = torch.zeros(self.n, dtype=torch.float32)
        padded[: self.n_real] = bias.float()
        return PackedMatrix(self.kind, self.data, self.d, self.sc, self.dmin, self.m, self.wide, padded, self.n,
                            self.n_real, self.k)


def _blocked(values: np.ndarray, n: int, dtype) -> torch.Tensor:
    """[n, x] per-row values -> [n/16, x, 16] (the 16 rows of a block side by side)."""
    x = values.shape[1]
    return torch.from_numpy(np.ascontiguousarray(values.reshape(n // ROWS, ROWS, x).transpose(0, 2, 1)).astype(dtype))


def _fp16_bits(values: np.ndarray, n: int) -> torch.Tensor:
    half = values.astype(np.float16)
    if not np.array_equal(half.astype(np.float32), values.astype(np.float32)):
        raise ValueError("scale factors must be fp16 values (they come from the GGUF's fp16 fields)")
    return _blocked(half.view(np.int16), n, np.int16)


def _chunks(q: np.ndarray) -> np.ndarray:
    """[n, k] -> [blocks, k/4 chunks, 64] (row r, k i at 4r + i)."""
    n, k = q.shape
    return q.reshape(n // ROWS, ROWS, k // 4, 4).transpose(0, 2, 1, 3).reshape(n // ROWS, k // 4, 64)


def _units(q: np.ndarray, bits: int) -> np.ndarray:
    """The values of a [n, k] matrix as the kernels' units: [blocks, k/32, unit bytes]."""
    chunks = _chunks(q)  # [B, k/4, 64]
    b, c = chunks.shape[:2]
    per_unit = chunks.reshape(b, c // 8, 8, 64)  # [B, units, 8 chunks, 64]
    if bits == 8:
        return per_unit.reshape(b, c // 8, 512)
    low = per_unit & 0x0F
    nibbles = (low[:, :, 0::2] | (low[:, :, 1::2] << 4)).reshape(b, c // 8, 256)  # chunk 2p low, 2p+1 high
    if bits == 4:
        return nibbles
    return np.concatenate([nibbles, _high_fields(per_unit >> 4, bits - 4)], axis=2)


def _high_fields(high: np.ndarray, width: int) -> np.ndarray:
    """[B, units, 8 chunks, 64] values of `width` bits -> [B, units, 64 * width] bytes (module doc)."""
    per_byte = 8 // width
    b, u = high.shape[:2]
    groups = high.reshape(b, u, width, per_byte, 64).astype(np.uint8)
    fields = np.zeros((b, u, width, 64), np.uint8)
    for j in range(per_byte):
        fields |= groups[:, :, :, j] << (width * j)
    return fields.reshape(b, u, 64 * width)


def pack(groups: IntGroups, bias: np.ndarray | torch.Tensor | None = None) -> PackedMatrix:
    """`groups` in the kernel layout. Raises ValueError for a shape the kernels cannot run
    (k not a multiple of the super-block, values out of the format's range)."""
    fmt = groups.format
    q = groups.q
    n_real, k = q.shape
    if k % max(UNIT, fmt.superblock):
        raise ValueError(f"{groups.kind} matrices need k a multiple of {max(UNIT, fmt.superblock)}, got {k}")
    if int(q.max(initial=0)) >= 1 << fmt.bits:
        raise ValueError(f"{groups.kind} values must fit {fmt.bits} bits")
    n = -(-n_real // ROWS) * ROWS
    pad = n - n_real

    def rows(a: np.ndarray | None, fill=0) -> np.ndarray | None:  # zero rows: value 0
        return None if a is None or not pad else np.concatenate([a, np.full((pad, a.shape[1]), fill, a.dtype)])

    q = rows(q, fmt.offset) if pad else q
    d = rows(groups.d) if pad else groups.d
    sc = rows(groups.sc) if pad else groups.sc
    dmin = rows(groups.dmin) if pad else groups.dmin
    m = rows(groups.m) if pad else groups.m
    wide = (q.reshape(n // ROWS, -1).max(axis=1) > NARROW_MAX).astype(np.uint8)
    if wide.any() and fmt.offset != 128:
        raise ValueError("8-bit values above 128 need the offset 128 (int8 stored as q + 128)")
    int_type = np.int8 if groups.kind == "q6_k" else np.uint8
    packed = PackedMatrix(
        groups.kind, torch.from_numpy(np.ascontiguousarray(_units(q, fmt.bits)).reshape(-1)), _fp16_bits(d, n),
        None if sc is None else _blocked(sc, n, int_type), None if dmin is None else _fp16_bits(dmin, n),
        None if m is None else _blocked(m, n, np.uint8), torch.from_numpy(wide), None, n, n_real, k)
    return packed.with_bias(None if bias is None else torch.as_tensor(bias))


def _unblocked(t: torch.Tensor | None, n: int) -> np.ndarray | None:
    if t is None:
        return None
    a = t.numpy()
    return np.ascontiguousarray(a.transpose(0, 2, 1).reshape(n, a.shape[1]))


def unpack(packed: PackedMatrix) -> IntGroups:
    """The `IntGroups` a `PackedMatrix` holds (tests; the source's rows only)."""
    fmt, n, k = packed.format, packed.n, packed.k
    units = packed.data.numpy().reshape(n // ROWS, k // UNIT, fmt.unit_bytes)
    if fmt.bits == 8:
        chunks = units.reshape(n // ROWS, k // 4, 64)
    else:
        nib = units[:, :, :256].reshape(n // ROWS, k // UNIT, 4, 64)
        per_unit = np.stack([nib & 0x0F, nib >> 4], axis=3).reshape(n // ROWS, k // UNIT, 8, 64)
        width = fmt.bits - 4
        if width:
            fields = units[:, :, 256:].reshape(n // ROWS, k // UNIT, width, 1, 64)
            shifts = width * np.arange(8 // width, dtype=np.uint8)[:, None]
            high = (fields >> shifts) & ((1 << width) - 1)
            per_unit = per_unit | (high.reshape(n // ROWS, k // UNIT, 8, 64) << 4)
        chunks = per_unit.reshape(n // ROWS, k // 4, 64)
    q = chunks.reshape(n // ROWS, k // 4, ROWS, 4).transpose(0, 2, 1, 3).reshape(n, k)
    half = lambda t: None if t is None else _unblocked(t, n).view(np.float16).astype(np.float32)  # noqa: E731
    cut = lambda a: None if a is None else a[: packed.n_real]  # noqa: E731
    return IntGroups(packed.kind, np.ascontiguousarray(q[: packed.n_real]), cut(half(packed.d)),
                     cut(_unblocked(packed.sc, n)), cut(half(packed.dmin)), cut(_unblocked(packed.m, n)))
