"""The CPU's instruction sets, as the kernels see them: a registry, chosen once at start.

headstart's C++ kernels are built per instruction-set level (`LEVELS`), each
with explicit compiler flags (never `-march=native`, so a build is what its
name says whatever machine compiles it). `select()` picks the best level
this CPU runs; `HEADSTART_CPU_ISA` restricts it to a lower one (an AVX-512
machine runs the AVX2 kernels, in tests and in CI), and an unknown name is
an error listing the valid ones. A level the CPU lacks is refused with the
flags it is missing: `auto` never picks a kernel that cannot run here.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "HEADSTART_CPU_ISA"


@dataclass(frozen=True)
class IsaLevel:
    """One build of the kernels: the CPU flags it needs (as /proc/cpuinfo names
    them) and the compiler flags that enable exactly those."""

    name: str
    cpu_flags: tuple[str, ...]
    compiler_flags: tuple[str, ...]
    define: str  # the preprocessor symbol the kernel sources switch on
    summary: str


# lowest first
LEVELS: dict[str, IsaLevel] = {
    level.name: level for level in (
        IsaLevel("avx2", ("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c"), "HS_ISA_AVX2",
                 "AVX2 + FMA (every x86-64 server CPU since 2013: Haswell, Zen 1-3)"),
        IsaLevel("avx512", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"),
                 ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"),
                 "HS_ISA_AVX512", "AVX-512 F/BW/VL/DQ (Skylake-SP)"),
        IsaLevel("avx512vnni", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"),
                 ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                  "-mavx512vnni"), "HS_ISA_AVX512VNNI",
                 "AVX-512 with VNNI int8 dot products (Cascade Lake and later, Zen 4-5)"),
    )
}


class IsaUnavailable(RuntimeError):
    """No kernel level can run here, or the one asked for cannot (the message says why)."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (empty off Linux / x86)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def missing(level: IsaLevel, flags: set[str]) -> list[str]:
    return [f for f in level.cpu_flags if f not in flags]


def supported(flags: set[str] | None = None) -> list[IsaLevel]:
    """The levels this CPU runs, lowest first."""
    flags = cpu_flags() if flags is None else flags
    if os.uname().machine not in ("x86_64", "AMD64"):
        return []
    return [level for level in LEVELS.values() if not missing(level, flags)]


def select(requested: str | None = None, flags: set[str] | None = None) -> IsaLevel:
    """The level the kernels run at: the best this CPU runs, or at most
    `requested` (default: `$HEADSTART_CPU_ISA`; `auto` or empty = the best).

    Raises:
        ValueError: `requested` names no level (the message lists them).
        IsaUnavailable: the CPU cannot run `requested` (the missing flags), or no level at all.
    """
    requested = (os.environ.get(ENV, "") if requested is None else requested).strip().lower()
    if requested not in ("", "auto") and requested not in LEVELS:
        raise ValueError(f"unknown CPU instruction-set level {requested!r} ({ENV}); valid: auto, "
                         + ", ".join(LEVELS))
    flags = cpu_flags() if flags is None else flags
    runnable = supported(flags)
    if not runnable:
        raise IsaUnavailable("this CPU runs none of headstart's kernel levels: they need x86-64 with "
                             f"{', '.join(LEVELS['avx2'].cpu_flags)}")
    if requested in ("", "auto"):
        return runnable[-1]
    level = LEVELS[requested]
    if level not in runnable:
        raise IsaUnavailable(f"{ENV}={requested}: this CPU lacks {', '.join(missing(level, flags))}")
    return level


def describe(level: IsaLevel) -> str:
    """One line for a log: what runs and why."""
    why = f"restricted by {ENV}" if os.environ.get(ENV, "").strip().lower() not in ("", "auto") else \
        "the best this CPU runs"
    return f"{level.name} ({level.summary}; {why})"
