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
`extend_rows` (many in one pass), `prefill` (a cold cache), `encode_rows`
(table-block precompute: every layer's keys and values over right-padded
rows). With a fast path on, a lone extension is a batch of one row of
`extend_rows`, so the cold baseline, prefix requests and sessions all run
the same kernels; with none it is the model's own forward (`_hf_extend`,
stopped between layers by the runner's `LayerHooks`).

The batched forward: `extend_rows` runs several `KVState`s' new tokens
through the model at once. On a weight-bound device (a CPU, a GPU at small
token counts) one pass over 8 rows' few tokens costs about one row's,
because the weights are read once.

Layout: **packed** (varlen), as vLLM's and nano-vllm's prefill is. The rows'
new tokens are concatenated into one sequence of T = sum(n_i) tokens, so the
linear layers (the cost) run once over [1, T, hidden]; each token keeps its
row's own positions (L_i + j), so RoPE is the lone extension's. Attention
is computed per row, on that row's own cache *in place*
(`headstart.engine.row_attention`): the scores of row i's queries against
its cached pieces (P0, its tail) and its n_i new keys (causally) are
softmaxed together and applied to the value pieces (rows of a few tokens:
one native kernel call per layer for all of them). No row's cached keys/values are copied:
not into a padded batch (`bench memory`), nor into a joined P0 + tail; the
new keys/values are appended to each row's tail after the last layer.

The decoder loop is run here, layer by layer, with the model's own modules
(norms, projections, rotary embedding, MLP): a Llama-family layer (Qwen2,
Llama, Mistral). Between layers each row's `should_abort` is polled; a row
that asks leaves (its tokens are dropped from the packed hidden states, its
state is left exactly as it was) and the others go on; when every row has
left the forward stops. The LM head runs only on the last position of the
rows that want logits. The weight-bound parts of each layer (norms,
projections, MLP) and the LM head run through the runner's ops (the
model's own modules, `EagerOps`, when none are installed).

Exactness: a row's attention, RoPE and positions are those of a lone
extension; the matrix products differ from it only in blocking (packed M),
so a batched row equals its lone forward up to floating-point reassociation.
The float64 exactness tests run sessions sharing batched forwards.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from headstart.engine.fast_ops import EagerOps
from headstart.engine.fast_path_auto import FastPathChoice, Timer
from headstart.engine.kernel_choice import make_ops, measure_auto, resolve_choice, supports_packed_rows
from headstart.engine.kv import KVState, RowExtension, kept_logits, truncate_layers
from headstart.engine.row_attention import layer_attention
from headstart.engine.shared_prefix import SharedPrefixLayer

__all__ = ["EncodedRows", "ModelRunner", "RowExtension", "supports_packed_rows"]  # the last two: re-exported


@dataclass
class _Rows:
    """The rows still in the forward and where their tokens sit in the packed sequence."""

    rows: list[int]  # original row indices still running
    starts: list[int]  # packed offset of each running row's first new token
    counts: list[int]  # new tokens of each running row
    # new K/V per layer per original row: [1, kv_heads, n_i, head_dim]
    new_kv: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)


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
        are bit-identical to its lone forward's (`_by_row`); it needs the
        runner for lone extensions too, so `off` becomes `eager` then."""
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
        return _packed_forward(self.model, self._ops or EagerOps(self.model), self.batch_invariant, calls)

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
            out = self.model(input_ids=input_ids, attention_mask=mask if len(rows) > 1 else None, use_cache=True,
                             logits_to_keep=1)
        layers = out.past_key_values.layers
        return EncodedRows(list(pre_rope), [layer.keys for layer in layers], [layer.values for layer in layers])

    @contextmanager
    def _capture_pre_rope_keys(self) -> Iterator[list[torch.Tensor | None]]:
        """Within the block, a forward stores every layer's keys before RoPE in
        the yielded list (entry i: `# [batch, kv_heads, tokens, head_dim]`).
        The hooks live for the block only: nothing stays on the model."""
        layers = self.model.model.layers
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
            state.cache = DynamicCache()
        device = next(self.model.parameters()).device
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=device)
        hooks = self._layer_hooks() if should_abort is not None else None
        if hooks is not None:
            hooks.before_layer = _stop_when(should_abort)
        try:
            out = self.model(input_ids=input_ids, past_key_values=state.cache, use_cache=True, logits_to_keep=1)
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

    def _layer_hooks(self) -> LayerHooks:
        if self._hooks is None:
            self._hooks = LayerHooks(self.model)
        return self._hooks


@torch.inference_mode()
def _packed_forward(model, ops, invariant: bool, calls: list) -> list[bool]:
    """`ModelRunner.extend_rows` with its model, ops and batch invariance given."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    decoder = model.model
    device = next(model.parameters()).device
    counts = [len(c.new_ids) for c in calls]
    starts = [sum(counts[:i]) for i in range(len(calls))]
    ids = torch.tensor([t for c in calls for t in c.new_ids], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(c.state.num_tokens, c.state.num_tokens + n, device=device)
                           for c, n in zip(calls, counts)])
    hidden = decoder.embed_tokens(ids[None])  # [1, T, hidden]
    cos, sin = decoder.rotary_emb(hidden, positions[None])
    live = _Rows(list(range(len(calls))), starts, counts)
    states = [c.state for c in calls]
    fused = getattr(ops, "decoder_layer", None)  # quant: a whole layer in one kernel call
    for index, layer in enumerate(decoder.layers):
        leaving = _rows_leaving(live, calls)
        if len(leaving) == len(live.rows):
            return [False] * len(calls)
        if leaving:
            hidden, cos, sin = _drop_rows(live, leaving, hidden, cos, sin)
        if fused is not None:
            live.new_kv.append({})
            hidden = fused(index, hidden, cos, sin, list(zip(live.rows, live.starts, live.counts)), states,
                           live.new_kv[-1])
            continue
        attn = layer.self_attn
        q, k, v = _by_row(lambda h: ops.qkv(index, h), live, invariant, hidden)
        shape = (1, hidden.shape[1], -1, attn.head_dim)
        q = q.view(shape).transpose(1, 2)  # [1, heads, T, head_dim]
        k = k.view(shape).transpose(1, 2)  # [1, kv_heads, T, head_dim]
        v = v.view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        live.new_kv.append({})  # this layer's new keys/values per row, filled by layer_attention
        out = layer_attention(attn, states, index, q, k, v,
                              list(zip(live.rows, live.starts, live.counts)), live.new_kv[-1], ops)  # [T, heads*dim]
        hidden = _by_row(lambda o, h: ops.post(index, o, h), live, invariant, out[None], hidden)
    hidden = _by_row(decoder.norm, live, invariant, hidden)[0]  # [T, hidden]
    logits = _row_logits(model, ops, calls, live, hidden, invariant)
    for b in live.rows:
        state = calls[b].state
        _append(state, live.new_kv, b)
        state.ids.extend(calls[b].new_ids)
        state.last_logits = logits.get(b)
    kept = set(live.rows)
    return [b in kept for b in range(len(calls))]


def _rows_leaving(live: _Rows, calls) -> list[int]:
    """The running rows whose `should_abort` asks them to leave, before a layer."""
    return [b for b in live.rows if calls[b].should_abort is not None and calls[b].should_abort()]


def _drop_rows(live: _Rows, leaving: list[int], hidden, cos, sin):
    keep = [i for i, b in enumerate(live.rows) if b not in leaving]
    index = torch.tensor([t for i in keep for t in range(live.starts[i], live.starts[i] + live.counts[i])],
                         dtype=torch.long, device=hidden.device)
    rows, counts = [live.rows[i] for i in keep], [live.counts[i] for i in keep]
    live.rows, live.counts = rows, counts
    live.starts = [sum(counts[:i]) for i in range(len(counts))]
    return hidden.index_select(1, index), cos.index_select(1, index), sin.index_select(1, index)


def _by_row(fn, live: _Rows, invariant: bool, *packed: torch.Tensor):
    """`fn` over the packed tokens [1, T, ...]; in batch-invariant mode over
    each row's tokens alone, so every matrix product sees the M of the row's
    lone forward and reduces in the same order (the rows' results are then
    bit-identical to their lone forwards, at the cost of reading the weights
    once per row)."""
    if not invariant or len(live.rows) == 1:
        return fn(*packed)
    parts = [fn(*(t[:, s:s + n] for t in packed)) for s, n in zip(live.starts, live.counts)]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(pieces, dim=1) for pieces in zip(*parts))
    return torch.cat(parts, dim=1)


def _row_logits(model, ops, calls, live: _Rows, hidden, invariant: bool = False) -> dict[int, torch.Tensor]:
    """The LM head on the last position of each running row that wants logits (the last
    `logits_positions` of a row asking for several: into its `position_logits`)."""
    wanted = [(i, b, _positions(calls[b], live.counts[i])) for i, b in enumerate(live.rows) if calls[b].want_logits]
    if not wanted:
        return {}
    index = [live.starts[i] + live.counts[i] - p + j for i, _, p in wanted for j in range(p)]
    picked = hidden.index_select(0, torch.tensor(index, device=hidden.device))  # [positions wanting logits, hidden]
    # batch-invariant: one position per call, as a lone extension's head runs
    rows = torch.cat([ops.head(picked[j:j + 1]) for j in range(len(index))]) if invariant else ops.head(picked)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # as the causal-LM classes that have it apply it (Gemma 2)
        rows = torch.tanh(rows / cap) * cap
    out, at = {}, 0
    for _, b, p in wanted:
        if p > 1:
            calls[b].position_logits = kept_logits(rows[at:at + p])
        out[b] = kept_logits(rows[at + p - 1])
        at += p
    return out


def _positions(call, new_tokens: int) -> int:
    return max(1, min(getattr(call, "logits_positions", 1), new_tokens))


def _append(state: KVState, new_kv: list[dict], b: int) -> None:
    if state.cache is None:  # a fresh cache: tails that grow in place (`SharedPrefixLayer` with no prefix)
        state.cache = DynamicCache()
        state.cache.layers = [SharedPrefixLayer(None, None) for _ in new_kv]
    layers = state.cache.layers
    for layer, per_row in enumerate(new_kv):
        k, v = per_row[b]
        if layer < len(layers) and isinstance(layers[layer], SharedPrefixLayer):
            layers[layer].append(k, v)  # not `update`: it returns a joined copy of P0 and the tail
        else:
            state.cache.update(k.contiguous(), v.contiguous(), layer)
