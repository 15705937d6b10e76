"""The quantized kernels (kernels/quant.cpp) for one instruction-set level, through ctypes.

`load(level)` builds (once, cached) and loads the library for a level of
`cpu_isa.LEVELS`; `load()` takes the level `cpu_isa.select()` picks (the best
the CPU runs, or `HEADSTART_CPU_ISA`'s). Each level is its own library, so a
test can load the AVX2 build beside the AVX-512 one and compare their bits.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import threading
from pathlib import Path

import torch

from headstart.kernels import cpu_isa
from headstart.kernels.build import KernelBuildError, build_and_load
from headstart.kernels.attention_args import token_rows, attention_arrays
from headstart.kernels.packing import PackedMatrix

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("quant.cpp")
ABI_VERSION = 4
# A decoder layer's scratch block above this is given back after each forward (a mapping
# of its own, unmapped when dropped: a prefill's); one at or below it is kept for the next
# forward (a decode step's, a typing chunk's: reused, never faulted in again). 8 MiB is
# about 100 tokens of the 0.5B.
KEEP_SCRATCH_BYTES = 8 << 20

_lock = threading.Lock()
_loaded: dict[str, "QuantKernel"] = {}


class QuantKernelUnavailable(RuntimeError):
    """The quantized kernels cannot run here (the message says why)."""


class _Segment(ctypes.Structure):
    # kernels/quant.cpp: struct Segment
    _fields_ = [("data", ctypes.c_void_p), ("d", ctypes.c_void_p), ("sc", ctypes.c_void_p),
                ("dmin", ctypes.c_void_p), ("m", ctypes.c_void_p), ("wide", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("n", ctypes.c_int64), ("col", ctypes.c_int64), ("kind", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class _LayerWeights(ctypes.Structure):
    # kernels/quant.cpp: struct LayerWeights
    _fields_ = [("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p), ("qkv", ctypes.c_void_p),
                ("o", ctypes.c_void_p), ("gate_up", ctypes.c_void_p), ("down", ctypes.c_void_p),
                ("nqkv", ctypes.c_int32), ("ngate_up", ctypes.c_int32)]


class _LayerShape(ctypes.Structure):
    # kernels/quant.cpp: struct LayerShape
    _fields_ = [("hidden", ctypes.c_int64), ("inter", ctypes.c_int64), ("heads", ctypes.c_int32),
                ("kv_heads", ctypes.c_int32), ("dim", ctypes.c_int32), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float)]


class FusedLayer:
    """One decoder layer's weights and shape as `QuantKernel.decoder_layer` reads them
    (built once; holds the tensors and ctypes structures alive)."""

    def __init__(self, norm1: torch.Tensor, norm2: torch.Tensor, qkv: "FusedSegments", o: "FusedSegments",
                 gate_up: "FusedSegments", down: "FusedSegments", heads: int, kv_heads: int, dim: int, eps: float,
                 scale: float):
        hidden, inter = norm1.numel(), down.k
        if any(x % 16 for x in (hidden, inter, dim)) or dim > 256 or heads % kv_heads:
            raise ValueError(f"fused layer: hidden {hidden}, intermediate {inter} and head dim {dim} must be "
                             "multiples of 16 (head dim at most 256), heads a multiple of kv heads")
        if qkv.padded or gate_up.padded or qkv.width != (heads + 2 * kv_heads) * dim or gate_up.width != 2 * inter:
            raise ValueError("fused layer: q/k/v and gate/up must be unpadded and of the layer's shape")
        self.norm1, self.norm2 = norm1.float().contiguous(), norm2.float().contiguous()
        self.parts = (qkv, o, gate_up, down)
        self.weights = _LayerWeights(self.norm1.data_ptr(), self.norm2.data_ptr(), ctypes.addressof(qkv.array),
                                     ctypes.addressof(o.array), ctypes.addressof(gate_up.array),
                                     ctypes.addressof(down.array), qkv.count, gate_up.count)
        self.shape = _LayerShape(hidden, inter, heads, kv_heads, dim, eps, scale)
        self.heads, self.kv_heads, self.dim, self.hidden = heads, kv_heads, dim, hidden


class QuantizedActivations:
    """Rows of x quantized as the kernels read them: xq int8 [M, K], xs float32
    [M, K/32] (one scale per 32), xsum float32 [M, K/16] (sums of 16 xq)."""

    __slots__ = ("xq", "xs", "xsum", "m", "k")

    def __init__(self, xq: torch.Tensor, xs: torch.Tensor, xsum: torch.Tensor):
        self.xq, self.xs, self.xsum = xq, xs, xsum
        self.m, self.k = xq.shape


class FusedSegments:
    """Several matrices sharing one input, as one kernel call (q/k/v; gate/up):
    their outputs side by side in one [M, sum of n] tensor. The ctypes array is
    built once."""

    def __init__(self, matrices: list[PackedMatrix]):
        ks = {m.k for m in matrices}
        if len(ks) != 1:
            raise ValueError(f"fused matrices must share k, got {sorted(ks)}")
        self.matrices = matrices
        self.k = ks.pop()
        self.width = sum(m.n for m in matrices)
        self.splits = [m.n_real for m in matrices]
        self.padded = any(m.n != m.n_real for m in matrices)
        col = 0
        segs = []
        for m in matrices:
            segs.append(_Segment(_ptr(m.data), _ptr(m.d), _ptr(m.sc), _ptr(m.dmin), _ptr(m.m), _ptr(m.wide),
                                 _ptr(m.bias), m.n, col, m.format.code, 0))
            col += m.n
        self.array = (_Segment * len(segs))(*segs)
        self.count = len(segs)
        # the real columns of the output when a matrix was padded to a multiple of 16 rows
        self.keep = None
        if self.padded:
            index, col = [], 0
            for m in matrices:
                index.extend(range(col, col + m.n_real))
                col += m.n
            self.keep = torch.tensor(index, dtype=torch.long)


class LayerScratch:
    """The scratch memory of `QuantKernel.decoder_layer`: one block that every layer of a
    forward reuses. The kernels used to allocate and free their arrays inside each layer
    call, and glibc kept the freed tens of MiB of a prefill's (issue 32: replica RSS).
    One per thread (it is handed to the kernel as it is)."""

    def __init__(self, keep_bytes: int = KEEP_SCRATCH_BYTES):
        self.keep_bytes = keep_bytes
        self._block: torch.Tensor | None = None
        self._mapping: mmap.mmap | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return 0 if self._block is None else self._block.numel()

    def pointer(self, nbytes: int) -> int:
        """The address of a block of at least `nbytes` (the one held, or a larger one)."""
        if self._block is None or self._block.numel() < nbytes:
            self.release()
            if nbytes > self.keep_bytes:
                self._mapping = mmap.mmap(-1, nbytes)
                self._block = torch.frombuffer(self._mapping, dtype=torch.uint8)
            else:
                self._block = torch.empty(nbytes, dtype=torch.uint8)
        return self._block.data_ptr()

    def end_forward(self) -> None:
        """The forward ended: give a block larger than `keep_bytes` back to the system."""
        if self.nbytes > self.keep_bytes:
            self.release()

    def release(self) -> None:
        self._block = None
        if self._mapping is not None:
            try:
                self._mapping.close()  # unmapped now
            except BufferError:
                pass  # a view of the block is still alive: unmapped when it goes
            self._mapping = None


class QuantKernel:
    """The loaded library of one level."""

    def __init__(self, library: ctypes.CDLL, level: cpu_isa.IsaLevel):
        self.level = level
        self._quantize = library.hs_q_quantize
        self._quantize.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 3 + [
            ctypes.c_int]
        self._quantize.restype = None
        self._matmul = library.hs_q_matmul
        self._matmul.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_void_p, ctypes.c_int,
                                                                                 ctypes.c_void_p, ctypes.c_int64,
                                                                                 ctypes.c_int]
        self._matmul.restype = None
        self._attend = library.hs_q_attend_batch
        self._attend.argtypes = ([ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 3
                                 + [ctypes.c_float] + [ctypes.c_void_p] * 6 + [ctypes.c_void_p, ctypes.c_int])
        self._attend.restype = None

        self._layer = library.hs_q_layer
        self._layer.argtypes = ([ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 4
                                + [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_void_p] * 8
                                + [ctypes.c_int])
        self._layer.restype = None
        self._scratch_bytes = library.hs_q_layer_scratch_bytes
        self._scratch_bytes.argtypes = [ctypes.c_int64, ctypes.c_void_p]
        self._scratch_bytes.restype = ctypes.c_int64

    @property
    def name(self) -> str:
        return self.level.name

    def quantize(self, x: torch.Tensor) -> QuantizedActivations:
        """x float32 [M, K] (K a multiple of 32) -> its int8 groups of 32."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % 32:
            raise ValueError(f"quantize: float32 [M, K] with K a multiple of 32 expected, got {x.dtype} "
                             f"{tuple(x.shape)}")
        x = x.contiguous()
        m, k = x.shape
        xq = torch.empty(m, k, dtype=torch.int8)
        xs = torch.empty(m, k // 32, dtype=torch.float32)
        xsum = torch.empty(m, k // 16, dtype=torch.float32)
        self._quantize(x.data_ptr(), m, k, xq.data_ptr(), xs.data_ptr(), xsum.data_ptr(), torch.get_num_threads())
        return QuantizedActivations(xq, xs, xsum)

    def matmul(self, acts: QuantizedActivations, fused: FusedSegments) -> torch.Tensor:
        """The fused matrices applied to quantized rows -> float32 [M, sum of n_real]."""
        if acts.k != fused.k:
            raise ValueError(f"matmul: activations of {acts.k} columns for matrices of {fused.k}")
        out = torch.empty(acts.m, fused.width, dtype=torch.float32)
        self._matmul(acts.xq.data_ptr(), acts.xs.data_ptr(), acts.xsum.data_ptr(), acts.m, acts.k, fused.array,
                     fused.count, out.data_ptr(), fused.width, torch.get_num_threads())
        return out if fused.keep is None else out.index_select(1, fused.keep)

    def linear(self, x: torch.Tensor, fused: FusedSegments) -> torch.Tensor:
        """x float32 [M, K] -> float32 [M, sum of n_real] (quantize, then matmul)."""
        return self.matmul(self.quantize(x), fused)

    def attend_batch(self, q: torch.Tensor, rows, scale: float) -> torch.Tensor:
        """As `native_kernel.NativeKernel.attend_batch`, float32 caches only,
        the same bits on every level: q float32 [tokens, heads, dim]; `rows`
        each row's (new tokens, cache pieces [1, kv_heads, L, dim]), the new
        keys last -> float32 [tokens, heads, dim]."""
        total, heads, dim = q.shape
        if dim % 16:
            raise ValueError(f"attention: head dim must be a multiple of 16, got {dim}")
        held, arrays, nqs, nsegs, kv_heads = attention_arrays(q, rows, (torch.float32,))
        out = torch.empty(total, heads, dim, dtype=torch.float32)
        self._attend(q.data_ptr(), len(rows), (ctypes.c_int * len(rows))(*nqs), heads, kv_heads, dim, scale,
                     (ctypes.c_int * len(rows))(*nsegs), *arrays, out.data_ptr(), torch.get_num_threads())
        del held
        return out


    def decoder_layer(self, layer: FusedLayer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      rows: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]],
                      scratch: LayerScratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer over the packed tokens of several rows, in place.

        hidden: float32 [T, hidden] contiguous, overwritten with the layer's
        output; cos, sin: float32 [T, dim] (the rows' positions); `rows`: each
        row's (new tokens, cache pieces), pieces [1, kv_heads, L, dim] float32
        with each token's values contiguous, read in place; `scratch`: the
        forward's scratch block (None: one for this call alone). Returns the new
        tokens' (keys after RoPE, values), each [kv_heads, T, dim]."""
        t = hidden.shape[0]
        if (hidden.dtype != torch.float32 or not hidden.is_contiguous() or hidden.shape[1] != layer.hidden
                or sum(n for n, _ in rows) != t or cos.shape != (t, layer.dim) or sin.shape != (t, layer.dim)):
            raise ValueError(f"decoder layer: hidden float32 contiguous [T, {layer.hidden}] and cos/sin [T, "
                             f"{layer.dim}] for the rows' {sum(n for n, _ in rows)} tokens expected")
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        held = []
        for _, pieces in rows:
            for keys, values in pieces:
                if keys.dtype != torch.float32 or keys.shape[1] != layer.kv_heads or keys.shape[-1] != layer.dim:
                    raise ValueError("decoder layer: cache pieces must be float32 [1, kv_heads, L, dim]")
                held.append((token_rows(keys), token_rows(values)))
        n = len(held)
        new_k = torch.empty(layer.kv_heads, t, layer.dim, dtype=torch.float32)
        new_v = torch.empty(layer.kv_heads, t, layer.dim, dtype=torch.float32)
        scratch = scratch if scratch is not None else LayerScratch()  # held here until the call returns
        work = scratch.pointer(self._scratch_bytes(t, ctypes.addressof(layer.shape)))
        self._layer(hidden.data_ptr(), t, ctypes.addressof(layer.weights), ctypes.addressof(layer.shape),
                    cos.data_ptr(), sin.data_ptr(), len(rows), (ctypes.c_int * len(rows))(*(r[0] for r in rows)),
                    (ctypes.c_int * len(rows))(*(len(r[1]) for r in rows)),
                    (ctypes.c_void_p * max(n, 1))(*(k.data_ptr() for k, _ in held)),
                    (ctypes.c_void_p * max(n, 1))(*(v.data_ptr() for _, v in held)),
                    (ctypes.c_int64 * max(n, 1))(*(k.shape[-2] for k, _ in held)),
                    (ctypes.c_int64 * max(n, 1))(*(k.stride(1) for k, _ in held)),
                    (ctypes.c_int64 * max(n, 1))(*(v.stride(1) for _, v in held)),
                    new_k.data_ptr(), new_v.data_ptr(), work, torch.get_num_threads())
        return new_k, new_v


def load(level: str | cpu_isa.IsaLevel | None = None) -> QuantKernel:
    """The kernels of `level` (default: `cpu_isa.select()`), built on first use.

    Raises:
        QuantKernelUnavailable: the CPU cannot run the level, or the build failed.
        ValueError: an unknown level name.
    """
    try:
        chosen = level if isinstance(level, cpu_isa.IsaLevel) else cpu_isa.select(level)
    except cpu_isa.IsaUnavailable as exc:
        raise QuantKernelUnavailable(str(exc)) from exc
    with _lock:
        if chosen.name in _loaded:
            return _loaded[chosen.name]
        try:
            library = build_and_load(SOURCE, (*chosen.compiler_flags, f"-D{chosen.define}"), f"quant-{chosen.name}")
        except KernelBuildError as exc:
            raise QuantKernelUnavailable(str(exc)) from exc
        if library.hs_q_abi_version() != ABI_VERSION:
            raise QuantKernelUnavailable(f"quant kernels have ABI {library.hs_q_abi_version()}, expected {ABI_VERSION}")
        kernel = _loaded[chosen.name] = QuantKernel(library, chosen)
        log.info("quantized kernels: %s", cpu_isa.describe(chosen))
        return kernel
