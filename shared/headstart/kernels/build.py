"""Build a kernel source into a shared library, once, and load it.

The libraries are C++ without torch headers or the Python C-API: plain C
functions called through ctypes with tensors' data pointers. Each is compiled
on the machine it runs on (g++, about a second) the first time it is needed
and cached under `<run dir>/kernels/<hash>/` (the hash covers the source, its
headers, the compiler and the flags), so a changed source builds anew. A
build goes to a temporary name and is renamed into place, so replicas
starting together never load a half-written library. OpenMP (native.cpp)
resolves to the libgomp torch already loaded (the same soname): those kernels
share torch's thread pool. The quantized kernels (quant.cpp) run their own
helper threads instead (see "the kernels' own threads" there: libgomp's
waiting made each parallel section of a decode step a wake-up).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# -ffp-contract=off: no multiply-add the source does not write (the kernels promise the same bits
# on every instruction set; a fused multiply-add the compiler chose for one build would break it)
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-ffp-contract=off")


class KernelBuildError(RuntimeError):
    """The library could not be built or loaded here; the message says why."""


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def build_and_load(source: Path, flags: tuple[str, ...], name: str) -> ctypes.CDLL:
    """`source` compiled with `BASE_FLAGS + flags` into `<name>.so` (cached), loaded.

    Raises:
        KernelBuildError: no compiler, a failed build, or a library that will not load.
    """
    cxx = compiler()
    if cxx is None:
        raise KernelBuildError("no C++ compiler (g++, c++ or clang++; or set CXX)")
    all_flags = (*BASE_FLAGS, *flags)
    digest = hashlib.sha256(source.read_bytes() + " ".join((cxx, *all_flags)).encode()).hexdigest()[:16]
    from headstart.paths import run_dir

    target = run_dir() / "kernels" / digest / f"{name}.so"
    if not target.exists():
        _compile(cxx, source, all_flags, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        raise KernelBuildError(f"could not load {target}: {exc}") from exc


def _compile(cxx: str, source: Path, flags: tuple[str, ...], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    command = [cxx, *flags, str(source), "-o", str(partial)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"building {source.name} failed: {exc}") from exc
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise KernelBuildError(f"building {source.name} failed ({' '.join(command)}): {done.stderr.strip()[-2000:]}")
    os.replace(partial, target)  # atomic: a concurrent loader sees the whole file or none
    log.info("built %s: %s", source.name, target)
