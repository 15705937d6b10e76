"""The model runner: one object owns a model's weights, its kernels and every forward.

`ModelRunner` holds the model, the kernel ops its forwards run (`fast_ops`:
the model's own modules, oneDNN packed matmuls, the native or quantized
kernels, compiled blocks; None: the Hugging Face forward), whether batched
rows must be batch-invariant, what the fast-path mode resolved to and why
(`FastPathChoice`, `kernel_choice`), the packed weights `auto` measured with,
and the model's hooks: those that stop a lone Hugging Face forward between
layers, and those that catch keys before RoPE for one precompute forward.
Nothing is stored on the model object. It is built once per engine with
HEADSTART_FAST_PATH (`auto` times `off`, `onednn` and `native` on this
machine at start, `fast_path_auto`); `set_fast_path` switches the mode
(tests and benchmarks compare modes on one model).

It is the only code that calls the model (`tests/test_model_calls.py`
fails on a call of the model's forward, `generate` or a forward hook
anywhere else). Its forwards: `extend` (one state's extension),
`extend_rows` (many in one pass: the rows' new tokens packed into one
sequence, each row attending to its own cache in place, the decoder loop
run with the runner's ops in `headstart.engine.packed_forward`, which only
the runner calls), `prefill` (a cold cache), `encode_rows` (table-block
precompute: every layer's keys and values over right-padded rows). With a
fast path on, a lone extension is a batch of one row of `extend_rows`, so
the cold baseline, prefix requests and sessions all run the same kernels;
with none it is the model's own forward (`_hf_extend`, stopped between
layers by the runner's `LayerHooks`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from headstart.engine.fast_ops import EagerOps
from headstart.engine.fast_path_auto import FastPathChoice, Timer
from headstart.engine.kernel_choice import make_ops, measure_auto, resolve_choice, supports_packed_rows
from headstart.engine.kv import KVState, RowExtension, kept_logits, truncate_layers
from headstart.engine.packed_forward import packed_forward
from headstart.engine.paged_kv import PagedCache

__all__ = ["EncodedRows", "ModelRunner", "RowExtension", "supports_packed_rows"]  # the last two: re-exported


@dataclass
class EncodedRows:
    """Every layer's keys and values of one right-padded forward over several
    rows (`ModelRunner.encode_rows`). Row r's first len(rows[r]) positions are
    its tokens'; the positions after them are padding (cut them off)."""

    keys_pre_rope: list[torch.Tensor]  # per layer [rows, kv_heads, width, head_dim], before RoPE
    keys: list[torch.Tensor]  # per layer [rows, kv_heads, width, head_dim], after RoPE (as the cache holds them)
    values: list[torch.Tensor]  # per layer [rows, kv_heads, width, head_dim]


class Superseded(Exception):
    """Raised between decoder layers when the extension in flight is no longer wanted."""


class LayerHooks:
    """One forward pre-hook (with kwargs) on every decoder layer, calling the
    active `before_layer(index, args, kwargs)`: it may raise `Superseded`
    to stop the forward (the lone Hugging Face extension's stop between
    layers; the batched path runs its layers itself). Registered once per
    model by its `ModelRunner`, which keeps it; only the worker thread runs
    forwards, so one slot is enough."""

    def __init__(self, model):
        self.before_layer: Callable[[int, tuple, dict], tuple | None] | None = None
        for index, layer in enumerate(model.model.layers):
            layer.register_forward_pre_hook(functools.partial(self._hook, index), with_kwargs=True)

    def _hook(self, index, module, args, kwargs):
        before = self.before_layer
        return None if before is None else before(index, args, kwargs)


def _stop_when(should_abort: Callable[[], bool]):
    def before_layer(index, args, kwargs):
        if should_abort():
            raise Superseded()
    return before_layer


class ModelRunner:
    """The one owner of a model's forwards and kernels (module doc).

    Args:
        model: the Hugging Face causal LM (its weights; never given attributes).
        fast_path: HEADSTART_FAST_PATH (`fast_ops.FAST_PATHS`), resolved and
            installed at once (`set_fast_path`); `off`: the model's own forward.
        batch_invariant: HEADSTART_BATCH_INVARIANT (`set_fast_path`).
        warm_rows: the token counts inductor compiles ahead (`set_fast_path`).
        timer: replaces the wall clock in `auto`'s timing (tests).

    Raises:
        ValueError: an unknown `fast_path`.
    """

    def __init__(self, model, *, fast_path: str = "off", batch_invariant: bool = False,
                 warm_rows: tuple[int, ...] = (1, 2), timer: Timer | None = None):
        self.model = model
        self.batch_invariant = False
        self._ops = None  # None: the Hugging Face forward for lone extensions
        self._choice: FastPathChoice | None = None
        self._auto: FastPathChoice | None = None  # auto's choice: measured once per runner, then reused
        self._measured_ops: dict = {}  # auto's packed weights, until the next `set_fast_path` installs or drops them
        self._hooks: LayerHooks | None = None  # registered on the model's layers at the first stoppable HF forward
        self.set_fast_path(fast_path, warm_rows=warm_rows, batch_invariant=batch_invariant, timer=timer)

    # -- kernels ---------------------------------------------------------------

    @property
    def ops(self):
        """The installed kernel ops (`fast_ops`, `native_ops`, `quant_ops`,
        `compiled_ops`); None when lone extensions run the model's own forward."""
        return self._ops

    @property
    def fast_path(self) -> str:
        """The kernels installed ("off" when none)."""
        return "off" if self._ops is None else self._ops.name

    @property
    def choice(self) -> FastPathChoice:
        """What the last `set_fast_path` chose, and why (`auto`'s timings)."""
        return self._choice

    @property
    def supports_packed_rows(self) -> bool:
        """Whether `extend_rows` can run this model's decoder layers itself (a
        Llama-family layer without sliding-window attention)."""
        return supports_packed_rows(self.model)

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
        then on every extension, lone (`extend`) or batched (`extend_rows`),
        runs them, so every mode of the engine uses the same kernels.
        `warm_rows` are the token counts compiled ahead (inductor: 1
        compiles the one-token graphs, any count above 1 the dynamic 2..64
        ones; each graph holds its own packed copy of the weights). Returns
        the resolved name ("off": the model's own forward for lone
        extensions); `choice` tells why (the timings, for `auto`).

        `batch_invariant` (HEADSTART_BATCH_INVARIANT): a batched row's results
        are bit-identical to its lone forward's (`packed_forward._by_row`);
        it needs the runner for lone extensions too, so `off` becomes `eager`
        then."""
        self.batch_invariant = batch_invariant
        choice = self.resolve_choice(mode, timer)
        resolved = choice.kernels
        if batch_invariant and resolved == "off" and self.supports_packed_rows:
            resolved = "eager"
        self._choice = choice
        measured, self._measured_ops = self._measured_ops, {}
        if self._ops is not None and self._ops.name == resolved:
            return resolved
        self.use_ops(make_ops(self.model, resolved, warm_rows, measured))
        return resolved

    def use_ops(self, ops) -> None:
        """Run every forward with `ops` (None: the model's own forward for
        lone extensions) without choosing them: `auto`'s timing swaps its
        candidates in and puts the ops back (`kernel_choice.measure_auto`).
        Anything else goes through `set_fast_path`."""
        self._ops = ops

    def _measure_auto(self, candidates: tuple[str, ...], timer: Timer | None) -> FastPathChoice:
        if self._auto is None:
            self._auto, self._measured_ops = measure_auto(self, candidates, timer)
        return self._auto

    # -- forwards --------------------------------------------------------------

    def extend(self, state: KVState, new_ids: list[int], want_logits: bool = True,
               should_abort: Callable[[], bool] | None = None) -> bool:
        """Run the model over `new_ids` on top of `state`, appending their K/V.

        Positions continue from the cache length. Stores the logits after the
        last new token when `want_logits` (only the last position is computed).
        `should_abort` is polled before each decoder layer: when it turns true
        the forward stops, the state is left exactly as it was, and False is
        returned (a newer snapshot made this work useless). With kernels
        installed this is `extend_rows` on a batch of one row; with none, the
        model's own forward (`_hf_extend`)."""
        if not new_ids:
            return True
        if self._ops is not None:
            return self.extend_rows([RowExtension(state, new_ids, want_logits, should_abort)])[0]
        return self._hf_extend(state, new_ids, want_logits, should_abort)

    def extend_rows(self, calls: list) -> list[bool]:
        """One packed forward over several states' extensions (module doc),
        with the installed ops (the model's own modules when none).

        `calls` are `RowExtension`s (or objects with the same attributes:
        `steps.Row`). Returns one bool per call: False for a row that left the
        forward because its `should_abort` asked (its state unchanged)."""
        return packed_forward(self.model, self._ops or EagerOps(self.model), self.batch_invariant, calls)

    def prefill(self, ids: list[int]) -> KVState:
        """A cold prefill: a fresh cache over `ids` with the last logits."""
        state = KVState()
        self.extend(state, ids)
        return state

    @torch.inference_mode()
    def encode_rows(self, rows: list[list[int]]) -> EncodedRows:
        """Table-block precompute (`tables.precompute`): one causal forward
        over several token rows, right-padded to the longest with the padding
        masked, returning every layer's keys (before and after RoPE) and values.

        Padding comes after each row's last token, so under causal attention
        it changes no real token's keys or values (only the rounding of the
        batched matmuls). It is the model's own (Hugging Face) forward,
        whatever kernels are installed: a block is keyed by model and dtype
        (`tables.keys`), not by kernels, and is precomputed by whichever
        process holds the model (an engine, the table-cache service), so every
        runner of a model must give the same bits. The keys before RoPE are
        the key projection's output (after a key norm where the model has
        one), caught by forward hooks registered for this forward only: the
        attention layer's own input to its rotary function, so re-applying it
        gives back the forward's keys bit for bit (`tables.rope`)."""
        device = next(self.model.parameters()).device
        width = max(len(ids) for ids in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(rows):
            input_ids[row, :len(ids)] = torch.tensor(ids, device=device)
            mask[row, :len(ids)] = 1
        with self._capture_pre_rope_keys() as pre_rope:
            # one row: no mask, as a lone prefill (the mask would only say "all ones")
            model = self._hf_model()
            out = model(input_ids=input_ids, attention_mask=mask if len(rows) > 1 else None, use_cache=True,
                        logits_to_keep=1)
        layers = out.past_key_values.layers
        return EncodedRows(list(pre_rope), [layer.keys for layer in layers], [layer.values for layer in layers])

    @contextmanager
    def _capture_pre_rope_keys(self) -> Iterator[list[torch.Tensor | None]]:
        """Within the block, a forward stores every layer's keys before RoPE in
        the yielded list (entry i: `# [batch, kv_heads, tokens, head_dim]`).
        The hooks live for the block only: nothing stays on the model."""
        layers = self._hf_model().model.layers
        captured: list[torch.Tensor | None] = [None] * len(layers)
        handles = []
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            k_norm = getattr(attn, "k_norm", None)  # Qwen3: keys are normed before RoPE
            source = k_norm if k_norm is not None else attn.k_proj

            def hook(_module, _inputs, output, i=i, head_dim=attn.head_dim):
                batch, tokens = output.shape[0], output.shape[1]
                # the attention layer's own reshape: [B, T, H*D] or [B, T, H, D] -> [B, H, T, D]
                captured[i] = output.detach().view(batch, tokens, -1, head_dim).transpose(1, 2)

            handles.append(source.register_forward_hook(hook))
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()

    @torch.inference_mode()
    def _hf_extend(self, state: KVState, new_ids: list[int], want_logits: bool,
                   should_abort: Callable[[], bool] | None) -> bool:
        """`extend` with no kernels installed: the model's own (Hugging Face)
        forward over `new_ids` on top of `state`, its `should_abort` polled
        before each decoder layer through the runner's `LayerHooks`."""
        old_len, fresh = state.num_tokens, state.cache is None
        if fresh:
            state.cache = PagedCache()
        device = next(self.model.parameters()).device
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=device)
        hooks = self._layer_hooks() if should_abort is not None else None
        if hooks is not None:
            hooks.before_layer = _stop_when(should_abort)
        try:
            model = self._hf_model()
            out = model(input_ids=input_ids, past_key_values=state.cache, use_cache=True, logits_to_keep=1)
        except Superseded:
            if fresh:
                state.cache = None
            else:
                truncate_layers(state.cache, old_len)
            return False
        finally:
            if hooks is not None:
                hooks.before_layer = None
        state.ids.extend(new_ids)
        state.last_logits = kept_logits(out.logits[0, -1]) if want_logits else None
        return True

    def _hf_model(self):
        """The model whose Hugging Face forward `encode_rows` and `_hf_extend` run: the model, or
        for a GGUF model (served without transformers' modeling code) its `hf_view`."""
        view = getattr(self.model, "hf_view", None)
        return view() if view is not None else self.model

    def _layer_hooks(self) -> LayerHooks:
        if self._hooks is None:
            self._hooks = LayerHooks(self._hf_model())
        return self._hooks
