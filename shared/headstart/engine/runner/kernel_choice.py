"""Which kernels a model's forwards run: HEADSTART_FAST_PATH resolved for one model.

`resolve_choice` turns a mode (`runner.ops.KERNEL_SETS`) into the kernel set
this model can run here, with the reason when it is not the one asked for
(`FastPathChoice`); `make_ops` builds that set's ops. `auto` times its
`auto_candidates` on a scratch cache through the model's runner
(`measure_auto`, deciding with `auto_timing.choose_kernels`). The
`ModelRunner` (`headstart.engine.runner.model_runner`) calls these once per mode
and keeps what they give: the choice, the ops, and the packed weights auto
measured with.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable

import torch

from headstart.engine.runner.ops import KERNEL_SETS
from headstart.engine.runner.ops.eager import EagerOps
from headstart.engine.runner.ops.onednn import OneDNNOps, onednn_supports
from headstart.engine.runner.auto_timing import (
    DECODE_ROWS,
    PREFILL_TOKENS,
    FastPathChoice,
    Timer,
    Workload,
    choose_kernels,
    wall_clock,
)
from headstart.engine.kv.state import KVState
from headstart.engine.runner.ops.native import NativeOps, native_supports
from headstart.engine.runner.ops.quant import QuantOps
from headstart.engine.runner.rows import Row
from headstart.models.quantized import is_quantized

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral")
# `auto` times the kernel sets from this hidden size (0.5B: 896; random:tiny: 32)
AUTO_MIN_HIDDEN = 256


def supports_packed_rows(model) -> bool:
    """Whether the runner can run this model's decoder layers itself (a
    Llama-family layer without sliding-window attention)."""
    config = model.config
    return getattr(config, "model_type", None) in SUPPORTED_MODEL_TYPES and not getattr(
        config, "use_sliding_window", False)


def auto_candidates(model) -> tuple[str, ...]:
    """The kernel sets `auto` times on this model: `off`, `onednn` and
    `native` (where its kernel builds here) for a real-sized
    (hidden >= AUTO_MIN_HIDDEN) Llama-family model on a CPU in float32 or
    bfloat16; none (so `off`, untimed) for float64, tiny models and
    other devices (a model whose layers the runner cannot run never gets
    here: `ModelRunner` refuses it). `inductor` is never a candidate: it
    compiles for minutes."""
    big = getattr(model.config, "hidden_size", 0) >= AUTO_MIN_HIDDEN
    if not (big and onednn_supports(model)):
        return ()
    return ("off", "onednn", "native") if native_supports(model) is None else ("off", "onednn")


def resolve_choice(model, mode: str,
                   measure_auto: Callable[[tuple[str, ...]], FastPathChoice] | None = None) -> FastPathChoice:
    """The kernels `mode` means for this model, and why. `auto` with
    candidates to time (`auto_candidates`) is `measure_auto(candidates)`
    (the runner's, which measures once and keeps the choice); any other
    mode is taken as given, untimed (`off` where the runner or oneDNN
    cannot run this model). Unknown mode -> ValueError."""
    if mode not in KERNEL_SETS:
        raise ValueError(f"unknown kernel set (HEADSTART_FAST_PATH) {mode!r}; valid: {', '.join(KERNEL_SETS)}")
    if is_quantized(model):  # its weights exist only as the quantized kernels read them
        reason = "" if mode in ("auto", "quant") else "a quantized (GGUF) model runs the quant kernels only"
        return FastPathChoice("quant", mode, reason=reason or f"quantized weights, {model.lm_head.kernel.name} kernels")
    if mode == "quant":
        return FastPathChoice("off", mode, reason="the model's weights are not quantized (load a GGUF model)")
    if mode == "auto":
        candidates = auto_candidates(model)
        if not candidates:
            return FastPathChoice("off", "auto", reason="not timed: float64, a tiny model, or no oneDNN kernels")
        if measure_auto is None:
            raise ValueError("auto on this model is measured by its ModelRunner")
        return measure_auto(candidates)
    if mode == "onednn" and not onednn_supports(model):
        return FastPathChoice("off", mode, reason="oneDNN has no kernels for this dtype or device")
    if mode == "native" and (why := native_supports(model)) is not None:
        fallback = "onednn" if onednn_supports(model) else "off"
        log.warning("kernel set native unavailable (%s): %s instead", why, fallback)
        return FastPathChoice(fallback, mode, reason=why)
    return FastPathChoice(mode, mode)


def make_ops(model, kernels: str, warm_rows: tuple[int, ...], measured: dict | None = None):
    """The ops of the kernel set `kernels` (a resolved name) for `model`
    (`off`: the model's own modules). `measured` holds ops auto already
    packed (reused, not packed again). `warm_rows`: inductor's token counts
    compiled ahead."""
    measured = measured or {}
    if kernels == "off":
        return EagerOps(model)
    if kernels == "onednn":
        return measured.get("onednn") or OneDNNOps(model)
    if kernels == "native":
        return measured.get("native") or NativeOps(model)
    if kernels == "quant":
        return QuantOps(model)
    from headstart.engine.runner.ops.inductor import InductorOps

    return InductorOps(model, warm_rows)


def measure_auto(runner, candidates: tuple[str, ...], timer: Timer | None) -> tuple[FastPathChoice, dict]:
    """`auto` for the runner's model (module doc of auto_timing): each
    candidate installed on `runner` in turn (`ModelRunner.use_ops`) and timed
    on a scratch cache, then the runner's ops put back as they were. Returns
    the choice and the packed ops of the winner ({} when it is `off`), for
    the runner to install rather than pack again."""
    model = runner.model
    start = time.perf_counter()
    before = runner.ops
    packed = before if before.name == "onednn" else OneDNNOps(model)
    timed = {"onednn": packed}
    if "native" in candidates:  # shares the packed weights: one more copy at most, not two
        timed["native"] = before if before.name == "native" else NativeOps(model, packed=packed)
    own = before if before.name == "off" else EagerOps(model)
    installs = {"off": lambda: runner.use_ops(own)}
    installs.update({name: (lambda ops=ops: runner.use_ops(ops)) for name, ops in timed.items()})
    # too loaded to time: the fastest on the quiet machines measured (docs/benchmarks-archive.md)
    bf16 = next(model.parameters()).dtype == torch.bfloat16
    fallback = "native" if "native" in candidates else "onednn" if bf16 else "off"
    try:
        choice = choose_kernels({name: installs[name] for name in candidates}, _auto_workloads(runner),
                                timer or wall_clock, fallback=fallback)
    finally:
        runner.use_ops(before)
    choice = replace(choice, seconds=time.perf_counter() - start)
    log.info("kernels: %s", choice.summary())
    return choice, ({choice.kernels: timed[choice.kernels]} if choice.kernels in timed else {})


def _auto_workloads(runner) -> list[tuple[str, Workload]]:
    """auto's workloads on a scratch cache: a cold prefill chunk, then one
    decode step of that cache alone and of four copies in one forward."""
    ids = [(1000 + 37 * i) % runner.model.config.vocab_size for i in range(PREFILL_TOKENS)]
    scratch: list[KVState] = []

    def prefill_chunk():
        scratch[:] = [KVState()]
        return lambda: runner.extend(scratch[0], ids)

    def decode(rows: int):
        def prepare():
            states = [scratch[0].copy() for _ in range(rows)]
            if rows == 1:
                return lambda: runner.extend(states[0], [ids[0]])
            return lambda: runner.extend_rows([Row(s, [ids[0]]) for s in states])
        return prepare

    return [(f"prefill_{PREFILL_TOKENS}", prefill_chunk), ("decode_1", decode(1)),
            (f"decode_{DECODE_ROWS}", decode(DECODE_ROWS))]
