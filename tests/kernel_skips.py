"""Skips for tests of CPU kernels this machine cannot run (the suite passes on AVX2-only and AVX-512 CPUs)."""

from __future__ import annotations

import pytest

from headstart.engine.runner.ops.onednn import onednn_supports
from headstart.engine.runner.ops.native import native_supports


def skip_unless_runs_here(model, mode: str) -> None:
    """Skip, with the reason, where `mode`'s kernels cannot run `model` on this CPU: `native` needs
    AVX-512; oneDNN's bfloat16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT."""
    if mode == "native" and (why := native_supports(model)) is not None:
        pytest.skip(f"native cannot run here: {why}")
    if mode == "onednn" and not onednn_supports(model):
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        pytest.skip(f"oneDNN has no {dtype} kernels on this CPU (bfloat16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)")
