"""The batched forward: many caches' extensions in one pass, no cache copied.

`extend_rows` runs several `KVState`s' new tokens through the model at once.
On a weight-bound device (a CPU, a GPU at small token counts) one pass over
8 rows' few tokens costs about one row's, because the weights are read once.

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
rows that want logits.

Kernels: the weight-bound parts of each layer (norms, projections, MLP) and
the LM head run through the model's *ops* (`fast_ops`: the model's own
modules, oneDNN packed matmuls, or compiled blocks), installed once by
`enable_fast_path` (HEADSTART_FAST_PATH; `auto` times `off`, `onednn` and `native`
on this machine at start, `fast_path_auto`). With a fast path on, a lone
extension (`kv.extend`) is a batch of one row here, so the cold baseline,
prefix requests and sessions all run the same kernels.

Exactness: a row's attention, RoPE and positions are those of a lone
extension; the matrix products differ from it only in blocking (packed M),
so a batched row equals its lone forward up to floating-point reassociation.
The float64 exactness tests run sessions sharing batched forwards.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from headstart.engine.fast_ops import FAST_PATHS, EagerOps, OneDNNOps, onednn_supports
from headstart.engine.fast_path_auto import (
    DECODE_ROWS,
    PREFILL_TOKENS,
    FastPathChoice,
    Timer,
    Workload,
    choose_kernels,
    wall_clock,
)
from headstart.engine.kv import KVState, extend, kept_logits
from headstart.engine.native_ops import NativeOps, native_supports
from headstart.engine.quant_ops import QuantOps
from headstart.models.quantized import is_quantized
from headstart.engine.row_attention import layer_attention
from headstart.engine.shared_prefix import SharedPrefixLayer

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral")
# `auto` times the fast paths from this hidden size (0.5B: 896; random:tiny: 32)
AUTO_MIN_HIDDEN = 256


@dataclass
class RowExtension:
    """One row of a batched forward: extend `state` by `new_ids`."""

    state: KVState
    new_ids: list[int]
    want_logits: bool = True
    should_abort: Callable[[], bool] | None = None
    logits_positions: int = 1  # the last positions whose logits are kept (into `position_logits`)
    position_logits: torch.Tensor | None = None


@dataclass
class _Rows:
    """The rows still in the forward and where their tokens sit in the packed sequence."""

    rows: list[int]  # original row indices still running
    starts: list[int]  # packed offset of each running row's first new token
    counts: list[int]  # new tokens of each running row
    # new K/V per layer per original row: [1, kv_heads, n_i, head_dim]
    new_kv: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)


def supports_packed_rows(model) -> bool:
    """Whether `extend_rows` can run this model's decoder layers itself (a
    Llama-family layer without sliding-window attention)."""
    config = model.config
    return getattr(config, "model_type", None) in SUPPORTED_MODEL_TYPES and not getattr(
        config, "use_sliding_window", False)


@torch.inference_mode()
def extend_rows(model, calls: list) -> list[bool]:
    """One packed forward over several states' extensions (module doc).

    `calls` are `RowExtension`s (or objects with the same four attributes).
    Returns one bool per call: False for a row that left the forward because
    its `should_abort` asked (its state unchanged)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    decoder = model.model
    ops = getattr(model, "_headstart_ops", None) or EagerOps(model)
    invariant = getattr(model, "_headstart_batch_invariant", False)
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
    from transformers import DynamicCache

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


def auto_candidates(model) -> tuple[str, ...]:
    """The kernel sets `auto` times on this model: `off`, `onednn` and
    `native` (where its kernel builds here) for a real-sized
    (hidden >= AUTO_MIN_HIDDEN) Llama-family model on a CPU in float32 or
    bfloat16; none (so `off`, untimed) for float64, tiny models,
    other devices and layers the runner cannot run. `inductor` is never a
    candidate: it compiles for minutes."""
    big = getattr(model.config, "hidden_size", 0) >= AUTO_MIN_HIDDEN
    if not (big and supports_packed_rows(model) and onednn_supports(model)):
        return ()
    return ("off", "onednn", "native") if native_supports(model) is None else ("off", "onednn")


def resolve_fast_path(model, mode: str, timer: Timer | None = None) -> str:
    """The kernels `mode` means for this model (`resolve_choice(...).kernels`).
    Unknown mode -> ValueError."""
    return resolve_choice(model, mode, timer).kernels


def resolve_choice(model, mode: str, timer: Timer | None = None) -> FastPathChoice:
    """The kernels `mode` means for this model, and why. `auto` times the
    `auto_candidates` on a scratch cache (`fast_path_auto.choose_kernels`;
    `timer` replaces the wall clock in tests), once per model: the choice is
    kept on the model and reused. Any other mode is taken as given, untimed
    (`off` where the runner or oneDNN cannot run this model).
    Unknown mode -> ValueError."""
    if mode not in FAST_PATHS:
        raise ValueError(f"unknown fast path {mode!r}; valid: {', '.join(FAST_PATHS)}")
    if is_quantized(model):  # its weights exist only as the quantized kernels read them
        reason = "" if mode in ("auto", "quant") else "a quantized (GGUF) model runs the quant kernels only"
        return FastPathChoice("quant", mode, reason=reason or f"quantized weights, {model.lm_head.kernel.name} kernels")
    if mode == "quant":
        return FastPathChoice("off", mode, reason="the model's weights are not quantized (load a GGUF model)")
    if mode == "auto":
        return _auto_choice(model, timer)
    if mode != "off" and not supports_packed_rows(model):  # the model's own forward
        return FastPathChoice("off", mode, reason="the runner cannot run this model's layers")
    if mode == "onednn" and not onednn_supports(model):
        return FastPathChoice("off", mode, reason="oneDNN has no kernels for this dtype or device")
    if mode == "native" and (why := native_supports(model)) is not None:
        fallback = "onednn" if onednn_supports(model) else "off"
        log.warning("fast path native unavailable (%s): %s instead", why, fallback)
        return FastPathChoice(fallback, mode, reason=why)
    return FastPathChoice(mode, mode)


def enable_fast_path(model, mode: str, warm_rows: tuple[int, ...] = (1, 2), batch_invariant: bool = False,
                     timer: Timer | None = None) -> str:
    """Install the kernels `mode` resolves to (`resolve_choice`) on `model`,
    once, at engine start. From then on every extension of this model, lone
    (`kv.extend`) or batched, runs `extend_rows` with those ops, so every
    mode of the engine uses the same kernels. `warm_rows` are the token
    counts compiled ahead (inductor: 1 compiles the one-token graphs, any
    count above 1 the dynamic 2..64 ones; each graph holds its own packed
    copy of the weights). Returns the resolved name ("off": the model's
    own forward for lone extensions, as before); `fast_path_choice(model)`
    tells why (the timings, for `auto`).

    `batch_invariant` (HEADSTART_BATCH_INVARIANT): a batched row's results
    are bit-identical to its lone forward's (`_by_row`); it needs the
    runner for lone extensions too, so `off` becomes `eager` then."""
    model._headstart_batch_invariant = batch_invariant
    choice = resolve_choice(model, mode, timer)
    resolved = choice.kernels
    if batch_invariant and resolved == "off" and supports_packed_rows(model):
        resolved = "eager"
    model._headstart_fast_path_choice = choice
    measured_ops = model.__dict__.pop("_headstart_measured_ops", {})  # auto's packed weights, reused
    current = getattr(model, "_headstart_ops", None)
    if current is not None and current.name == resolved:
        return resolved
    if resolved == "off":
        _install(model, None)
        return resolved
    if resolved == "eager":
        ops = EagerOps(model)
    elif resolved == "onednn":
        ops = measured_ops.get("onednn") or OneDNNOps(model)
    elif resolved == "native":
        ops = measured_ops.get("native") or NativeOps(model)
    elif resolved == "quant":
        ops = QuantOps(model)
    else:
        from headstart.engine.compiled_ops import InductorOps

        ops = InductorOps(model, warm_rows)
    _install(model, ops)
    return resolved


def fast_path_choice(model) -> FastPathChoice:
    """What `enable_fast_path` last chose for `model`, with `auto`'s timings."""
    choice = getattr(model, "_headstart_fast_path_choice", None)
    return choice if choice is not None else FastPathChoice(fast_path_name(model), "off")


def _install(model, ops) -> None:
    model._headstart_ops = ops
    model._headstart_fast_extend = None if ops is None else _lone_extend


def _auto_choice(model, timer: Timer | None) -> FastPathChoice:
    """`auto` for this model: measured once (module doc of fast_path_auto), then reused."""
    cached = getattr(model, "_headstart_auto_choice", None)
    if cached is not None:
        return cached
    candidates = auto_candidates(model)
    if not candidates:
        return FastPathChoice("off", "auto", reason="not timed: float64, a tiny model, or no oneDNN kernels")
    start = time.perf_counter()
    before = getattr(model, "_headstart_ops", None)
    packed = before if before is not None and before.name == "onednn" else OneDNNOps(model)
    timed = {"onednn": packed}
    if "native" in candidates:  # shares the packed weights: one more copy at most, not two
        timed["native"] = before if before is not None and before.name == "native" else NativeOps(model, packed=packed)
    installs = {"off": lambda: _install(model, None)}
    installs.update({name: (lambda ops=ops: _install(model, ops)) for name, ops in timed.items()})
    # too loaded to time: the fastest on the quiet machines measured (docs/benchmarks-archive.md)
    bf16 = next(model.parameters()).dtype == torch.bfloat16
    fallback = "native" if "native" in candidates else "onednn" if bf16 else "off"
    try:
        choice = choose_kernels({name: installs[name] for name in candidates}, _auto_workloads(model),
                                timer or wall_clock, fallback=fallback)
    finally:
        _install(model, before)
    choice = replace(choice, seconds=time.perf_counter() - start)
    if choice.kernels in timed:
        model._headstart_measured_ops = {choice.kernels: timed[choice.kernels]}
    model._headstart_auto_choice = choice
    log.info("fast path: %s", choice.summary())
    return choice


def _auto_workloads(model) -> list[tuple[str, Workload]]:
    """auto's workloads on a scratch cache: a cold prefill chunk, then one
    decode step of that cache alone and of four copies in one forward."""
    ids = [(1000 + 37 * i) % model.config.vocab_size for i in range(PREFILL_TOKENS)]
    scratch: list[KVState] = []

    def prefill_chunk():
        scratch[:] = [KVState()]
        return lambda: extend(model, scratch[0], ids)

    def decode(rows: int):
        def prepare():
            states = [scratch[0].copy() for _ in range(rows)]
            if rows == 1:
                return lambda: extend(model, states[0], [ids[0]])
            return lambda: extend_rows(model, [RowExtension(s, [ids[0]]) for s in states])
        return prepare

    return [(f"prefill_{PREFILL_TOKENS}", prefill_chunk), ("decode_1", decode(1)),
            (f"decode_{DECODE_ROWS}", decode(DECODE_ROWS))]


def fast_path_name(model) -> str:
    """The kernels installed on `model` ("off" when none)."""
    ops = getattr(model, "_headstart_ops", None)
    return "off" if ops is None else ops.name


def _lone_extend(model, state: KVState, new_ids: list[int], want_logits: bool, should_abort) -> bool:
    """`kv.extend` of a model with a fast path: a batch of one row."""
    return extend_rows(model, [RowExtension(state, new_ids, want_logits, should_abort)])[0]
