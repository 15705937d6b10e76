"""Builds and loads headstart's native kernels (kernels/native.cpp): a small-M
linear layer and the rows' few new tokens' attention over their caches.

The kernel is C++ with AVX-512 intrinsics, built for the instruction-set
level `kernels.cpu_isa` selects (explicit flags per level, never
`-march=native`; the LM head's screening pass only at `avx512vnni`) the
first time a model asks for it, and cached (`kernels.build`). On a CPU
without AVX-512, or with `HEADSTART_CPU_ISA=avx2`, it is unavailable and the
engine runs oneDNN's kernels, saying why.

No torch headers and no Python C-API: the library exports plain C functions
called through ctypes with the tensors' data pointers (a call costs a few
microseconds; a decode step makes ~100). Its OpenMP resolves to the libgomp
torch has already loaded (the same soname), so it runs on torch's threads.

`load()` returns a `NativeKernel` or raises `NativeKernelUnavailable` with
the reason (no AVX-512, no C++ compiler, a failed build): callers fall back
to the oneDNN kernels and say why.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import torch

from headstart.kernels import cpu_isa
from headstart.kernels.attention_args import attention_arrays
from headstart.kernels.build import KernelBuildError, build_and_load

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native.cpp")
# the instruction-set levels it is built for (cpu_isa.LEVELS; HEADSTART_CPU_ISA=avx2 turns it off)
AVX512_LEVELS = ("avx512", "avx512vnni")
ABI_VERSION = 5

_lock = threading.Lock()
_loaded: dict[str, "NativeKernel"] = {}
_failures: dict[str, str] = {}


class NativeKernelUnavailable(RuntimeError):
    """The native kernel cannot run here; the message says why."""


class NativeKernel:
    """The loaded library: `linear(x, weight, bias)` for float32 or bfloat16 weights."""

    def __init__(self, library: ctypes.CDLL, path: Path):
        self.path = path
        args = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        self._f32 = library.hs_linear_f32
        self._bf16 = library.hs_linear_bf16
        for fn in (self._f32, self._bf16):
            fn.argtypes, fn.restype = args, None
        self._attend = library.hs_attend_batch
        self._attend.argtypes = ([ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 3
                                 + [ctypes.c_float] + [ctypes.c_void_p] * 6 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_int])
        self._attend.restype = None
        self._screen = library.hs_screen_u8i8
        self._screen.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        self._screen.restype = None
        self.screen_available = bool(library.hs_screen_available())
        self._select = library.hs_screen_select
        self._select.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_double] * 2 + [ctypes.c_int64, ctypes.c_void_p,
                                                                                  ctypes.c_int64])
        self._select.restype = ctypes.c_int64

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x float32 [M, K] (contiguous), weight [N, K] contiguous float32 or
        bfloat16, bias float32 [N] or None -> float32 [M, N].

        Any M runs, but the kernel is built for small M (it reads the weights
        once per block of 4 input rows); callers use it up to a few tokens."""
        m, k = x.shape
        n = weight.shape[0]
        if x.dtype != torch.float32 or not x.is_contiguous() or weight.shape[1] != k or not weight.is_contiguous():
            raise ValueError(f"native linear: x float32 contiguous [M, {weight.shape[1]}] and a contiguous weight "
                             f"expected; got x {x.dtype} {tuple(x.shape)}, weight {tuple(weight.shape)}")
        if bias is not None and (bias.dtype != torch.float32 or bias.numel() != n or not bias.is_contiguous()):
            raise ValueError("native linear: the bias must be a contiguous float32 [N]")
        if weight.dtype == torch.float32:
            fn = self._f32
        elif weight.dtype == torch.bfloat16:
            fn = self._bf16
        else:
            raise ValueError(f"native linear: float32 or bfloat16 weights, not {weight.dtype}")
        out = torch.empty(m, n, dtype=torch.float32)
        fn(weight.data_ptr(), x.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
           m, n, k, torch.get_num_threads())
        return out

    def screen_u8i8(self, xu: torch.Tensor, xscale: torch.Tensor, q: torch.Tensor, qsum: torch.Tensor,
                    scale: torch.Tensor) -> torch.Tensor:
        """The screening pass (kernels/native.cpp): y[m, n] = scale[n] *
        xscale[m] * sum_k q[n, k] * (xu[m, k] - 128), the sum exact in int32.
        xu uint8 [M, K], xscale float32 [M], q int8 [N, K], qsum int32 [N]
        (q's row sums), scale float32 [N], all contiguous -> float32 [M, N].
        Needs `screen_available` (AVX512-VNNI)."""
        if not self.screen_available:
            raise NativeKernelUnavailable("this CPU has no AVX512-VNNI for the screening pass")
        m, k = xu.shape
        n = q.shape[0]
        ok = (xu.dtype == torch.uint8 and xscale.dtype == torch.float32 and q.dtype == torch.int8
              and qsum.dtype == torch.int32 and scale.dtype == torch.float32 and q.shape[1] == k
              and xscale.numel() == m and qsum.numel() == n and scale.numel() == n
              and all(t.is_contiguous() for t in (xu, xscale, q, qsum, scale)))
        if not ok:
            raise ValueError(f"native screen: xu uint8 [M, K], xscale float32 [M], q int8 [N, K], qsum int32 [N], "
                             f"scale float32 [N], contiguous; got xu {xu.dtype} {tuple(xu.shape)}, "
                             f"q {q.dtype} {tuple(q.shape)}")
        out = torch.empty(m, n, dtype=torch.float32)
        self._screen(q.data_ptr(), qsum.data_ptr(), scale.data_ptr(), xu.data_ptr(), xscale.data_ptr(),
                     out.data_ptr(), m, n, k, torch.get_num_threads())
        return out

    def screen_select(self, est: torch.Tensor, a: torch.Tensor, b: torch.Tensor, hnorm: float, off: float,
                      cap: int) -> torch.Tensor | None:
        """The screen's candidates for one row (kernels/native.cpp): est
        float32 [N], a and b float64 [N], all contiguous -> int64 indices in
        order, or None when there are more than `cap`."""
        n = est.numel()
        if not (est.dtype == torch.float32 and a.dtype == b.dtype == torch.float64 and a.numel() == b.numel() == n
                and est.is_contiguous() and a.is_contiguous() and b.is_contiguous()):
            raise ValueError("native screen select: est float32 [N], a and b float64 [N], contiguous")
        out = torch.empty(max(cap, 1), dtype=torch.int64)
        count = self._select(est.data_ptr(), a.data_ptr(), b.data_ptr(), hnorm, off, n, out.data_ptr(), cap)
        return out[:count] if count <= cap else None

    def attend_batch(self, q: torch.Tensor, rows: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]],
                     scale: float) -> torch.Tensor:
        """Several rows' new tokens' attention in one call (a batched
        forward's layer), causal: q float32 [sum of nq, heads, dim] (RoPE
        applied), the rows' tokens one row after another; `rows` gives each
        row's `(nq, pieces)`: its cache's (keys, values) pieces in order, each
        [1, kv_heads, L, dim] (views are fine when a token's `dim` values are
        contiguous), all of one dtype, float32 or bfloat16, the new tokens'
        keys the last `nq` of the last piece; token t of a row sees the cache
        and the row's new tokens up to itself. Softmax in float32. -> float32
        [sum of nq, heads, dim]. Each (token, head) is summed in one fixed
        order: a row's output is the same bits alone or beside other rows,
        and a token's the same bits as in a call over the pieces cut after it."""
        held, arrays, nqs, nsegs, kv_heads = attention_arrays(q, rows, (torch.float32, torch.bfloat16))
        total, heads, dim = q.shape
        dtype = rows[0][1][0][0].dtype
        out = torch.empty(total, heads, dim, dtype=torch.float32)
        self._attend(q.data_ptr(), len(rows), (ctypes.c_int * len(rows))(*nqs), heads, kv_heads, dim, scale,
                     (ctypes.c_int * len(rows))(*nsegs), *arrays, int(dtype == torch.bfloat16), out.data_ptr(),
                     torch.get_num_threads())
        del held
        return out


def load() -> NativeKernel:
    """The kernel, built on first use and cached (module doc); raises
    `NativeKernelUnavailable` with the reason when it cannot run here."""
    try:
        level = cpu_isa.select()
    except (ValueError, cpu_isa.IsaUnavailable) as exc:
        raise NativeKernelUnavailable(str(exc)) from exc
    if level.name not in AVX512_LEVELS:
        raise NativeKernelUnavailable(f"the native kernel needs AVX-512; the kernels run at {cpu_isa.describe(level)}")
    with _lock:
        if level.name in _loaded:
            return _loaded[level.name]
        if level.name in _failures:
            raise NativeKernelUnavailable(_failures[level.name])
        try:
            library = build_and_load(SOURCE, level.compiler_flags, f"native-{level.name}")
        except KernelBuildError as exc:
            _failures[level.name] = str(exc)
            raise NativeKernelUnavailable(str(exc)) from exc
        if library.hs_abi_version() != ABI_VERSION:
            raise NativeKernelUnavailable(f"native kernel has ABI {library.hs_abi_version()}, expected {ABI_VERSION}")
        kernel = _loaded[level.name] = NativeKernel(library, Path(library._name))
        log.info("native kernel (%s) loaded from %s", level.name, library._name)
        return kernel


def unavailable_reason() -> str | None:
    """None when the kernel loads here, else why not (builds it if needed)."""
    try:
        load()
    except NativeKernelUnavailable as exc:
        return str(exc)
    return None
