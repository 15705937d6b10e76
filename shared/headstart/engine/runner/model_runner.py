"""The model runner: one object owns a model's weights, its kernels and every forward.

`ModelRunner` holds the model, the ops of its kernel set (`runner.ops`),
whether batched rows must be batch-invariant, what HEADSTART_FAST_PATH
resolved to and why (`kernel_choice`), and the packed weights `auto`
measured with. Nothing is stored on the model object and no hook is left on
it. It is the only code that calls the model (`tests/test_model_calls.py`),
and it has one forward path, the decoder loop (`runner.decoder_loop`):

- `extend_rows`: several states' extensions in one packed forward;
- `extend`: one state's extension, a batch of one row (so cold prefills,
  prefix requests and sessions run the same kernels);
- `prefill`: an `extend` of an empty state;
- `encode_rows`: table-block precompute, the same loop over fresh rows with
  the model's own modules, returning every layer's keys and values.

A row's `should_abort` is polled before each decoder layer: a superseded
extension leaves its state exactly as it was. A model whose layers the loop
cannot run (not Llama-family, or sliding-window attention) is refused at
construction (`UnsupportedModel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from headstart.engine.runner.ops.eager import EagerOps
from headstart.engine.runner.auto_timing import FastPathChoice, Timer
from headstart.engine.runner.kernel_choice import (SUPPORTED_MODEL_TYPES, make_ops, measure_auto, resolve_choice,
                                                    supports_packed_rows)
from headstart.engine.kv.state import KVState
from headstart.engine.runner.decoder_loop import run_decoder
from headstart.engine.runner.rows import Row
from headstart.models.loaded import ModelLoadError

__all__ = ["EncodedRows", "ModelRunner", "UnsupportedModel"]


@dataclass
class EncodedRows:
    """Every layer's keys and values of one encoding forward over several
    token rows (`ModelRunner.encode_rows`): entry [layer][row] is row's
    `# [kv_heads, len(rows[row]), head_dim]`, no padding."""

    keys_pre_rope: list[list[torch.Tensor]]  # before RoPE
    keys: list[list[torch.Tensor]]  # after RoPE (as a cache holds them)
    values: list[list[torch.Tensor]]


class UnsupportedModel(ModelLoadError, ValueError):
    """The runner's decoder loop cannot run this model's layers (`supports_packed_rows`):
    a model that loads but cannot be served, so callers that report load errors report it."""


class ModelRunner:
    """The one owner of a model's forwards and kernels (module doc).

    Args:
        model: the Hugging Face causal LM (its weights; never given attributes).
        fast_path: HEADSTART_FAST_PATH (`runner.ops.KERNEL_SETS`), resolved and
            installed at once (`set_fast_path`); `off`: the model's own modules.
        batch_invariant: HEADSTART_BATCH_INVARIANT (`set_fast_path`).
        warm_rows: the token counts inductor compiles ahead (`set_fast_path`).
        timer: replaces the wall clock in `auto`'s timing (tests).

    Raises:
        ValueError: an unknown `fast_path`.
        UnsupportedModel: a model whose layers the runner cannot run.
    """

    def __init__(self, model, *, fast_path: str = "off", batch_invariant: bool = False,
                 warm_rows: tuple[int, ...] = (1, 2), timer: Timer | None = None):
        if not supports_packed_rows(model):
            config = model.config
            raise UnsupportedModel(
                f"headstart's runner runs Llama-family decoder layers ({', '.join(SUPPORTED_MODEL_TYPES)}) "
                f"without sliding-window attention; this model is {getattr(config, 'model_type', None)!r}"
                + (" with sliding-window attention" if getattr(config, "use_sliding_window", False) else ""))
        self.model = model
        self.batch_invariant = False
        self._ops = EagerOps(model)
        self._choice: FastPathChoice | None = None
        self._auto: FastPathChoice | None = None  # auto's choice: measured once per runner, then reused
        self._measured_ops: dict = {}  # auto's packed weights, until the next `set_fast_path` installs or drops them
        self.set_fast_path(fast_path, warm_rows=warm_rows, batch_invariant=batch_invariant, timer=timer)

    # -- kernels ---------------------------------------------------------------

    @property
    def ops(self):
        """The ops object of the installed kernel set (`runner.ops`; `EagerOps`,
        the model's own modules, for `off`)."""
        return self._ops

    @property
    def fast_path(self) -> str:
        """The kernels installed (`off`: the model's own modules)."""
        return self._ops.name

    @property
    def choice(self) -> FastPathChoice:
        """What the last `set_fast_path` chose, and why (`auto`'s timings)."""
        return self._choice

    def resolve_choice(self, mode: str, timer: Timer | None = None) -> FastPathChoice:
        """The kernels `mode` means for this model, and why
        (`kernel_choice.resolve_choice`), installing nothing. `auto` times
        the candidates on a scratch cache once per runner (`timer` replaces
        the wall clock in tests) and reuses that choice after.
        Unknown mode -> ValueError."""
        return resolve_choice(self.model, mode, lambda candidates: self._measure_auto(candidates, timer))

    def set_fast_path(self, mode: str, *, warm_rows: tuple[int, ...] = (1, 2), batch_invariant: bool = False,
                      timer: Timer | None = None) -> str:
        """Install the kernels `mode` resolves to (`resolve_choice`). From
        then on every forward but table-block precompute runs them, so every
        mode of the engine uses the same kernels. `warm_rows` are the token
        counts compiled ahead (inductor: 1 compiles the one-token graphs, any
        count above 1 the dynamic 2..64 ones; each graph holds its own packed
        copy of the weights). Returns the resolved name; `choice` tells why
        (the timings, for `auto`).

        `batch_invariant` (HEADSTART_BATCH_INVARIANT): a batched row's results
        are bit-identical to its lone forward's (`decoder_loop._by_row`)."""
        self.batch_invariant = batch_invariant
        choice = self.resolve_choice(mode, timer)
        resolved = choice.kernels
        self._choice = choice
        measured, self._measured_ops = self._measured_ops, {}
        if self._ops.name == resolved:
            return resolved
        self.use_ops(make_ops(self.model, resolved, warm_rows, measured))
        return resolved

    def use_ops(self, ops) -> None:
        """Run every forward with `ops` without choosing them: `auto`'s
        timing swaps its candidates in and puts the ops back
        (`kernel_choice.measure_auto`). Anything else goes through
        `set_fast_path`."""
        self._ops = ops

    def _measure_auto(self, candidates: tuple[str, ...], timer: Timer | None) -> FastPathChoice:
        if self._auto is None:
            self._auto, self._measured_ops = measure_auto(self, candidates, timer)
        return self._auto

    # -- forwards --------------------------------------------------------------

    def extend(self, state: KVState, new_ids: list[int], want_logits: bool = True,
               should_abort: Callable[[], bool] | None = None) -> bool:
        """Run the model over `new_ids` on top of `state`, appending their K/V:
        `extend_rows` on a batch of one row.

        Positions continue from the cache length. Stores the logits after the
        last new token when `want_logits` (only the last position is computed).
        `should_abort` is polled before each decoder layer: when it turns true
        the forward stops, the state is left exactly as it was, and False is
        returned (a newer snapshot made this work useless)."""
        if not new_ids:
            return True
        return self.extend_rows([Row(state, new_ids, want_logits, should_abort)])[0]

    def extend_rows(self, rows: list[Row]) -> list[bool]:
        """One packed forward over several states' extensions (module doc),
        with the installed ops. Returns one bool per row: False for a row
        that left the forward because its `should_abort` asked (its state
        unchanged)."""
        return run_decoder(self.model, self._ops, self.batch_invariant, rows)

    def prefill(self, ids: list[int]) -> KVState:
        """A cold prefill: a fresh cache over `ids` with the last logits."""
        state = KVState()
        self.extend(state, ids)
        return state

    def encode_rows(self, rows: list[list[int]]) -> EncodedRows:
        """Table-block precompute (`tables.precompute`): the runner's loop over
        several token rows, each a fresh sequence from position 0, returning
        every layer's keys (before and after RoPE) and values; no cache is kept.

        It runs the model's own modules (`EagerOps`, batch-invariant: each
        row's products see only its own tokens), whatever kernels are
        installed: a block is keyed by model and dtype (`tables.keys`), not by
        kernels or by which groups shared its forward, and is precomputed by
        whichever process holds the model (an engine, the table-cache
        service), so every runner of a model gives the same bits, and a row's
        bits are its lone cold prefill's with the model's own modules. The
        keys before RoPE are the key projection's output, the loop's own input
        to its rotary function, so re-applying RoPE gives back the cached keys
        bit for bit (`tables.rope`). A GGUF model (served without
        transformers' modeling code) encodes through its `hf_view`, the same
        quantized modules seen by transformers."""
        view = getattr(self.model, "hf_view", None)
        model = view() if view is not None else self.model
        fresh = [Row(KVState(), list(ids), want_logits=False) for ids in rows]
        capture: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        run_decoder(model, EagerOps(model), True, fresh, capture)
        bounds = []
        at = 0
        for ids in rows:
            bounds.append((at, len(ids)))
            at += len(ids)

        def split(packed: torch.Tensor) -> list[torch.Tensor]:  # [kv_heads, T, dim] -> each row's
            return [packed[:, s:s + n] for s, n in bounds]

        return EncodedRows([split(pre) for pre, _, _ in capture], [split(k) for _, k, _ in capture],
                           [split(v) for _, _, v in capture])
