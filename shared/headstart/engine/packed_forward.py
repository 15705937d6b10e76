"""The runner's one forward path: the decoder loop over packed rows (`ModelRunner.extend_rows`).

Only the runner calls it (`ModelRunner.extend_rows`, which `extend` and
`prefill` are a row of, and `encode_rows`), handing it its model, its ops
and its batch invariance; it is the runner's one forward path, kept in a
file of its own (`tests/test_model_calls.py` checks that nothing else
imports it).

`packed_forward` runs several `KVState`s' new tokens through the model at
once. On a weight-bound device (a CPU, a GPU at small token counts) one
pass over 8 rows' few tokens costs about one row's, because the weights are
read once.

Layout: **packed** (varlen), as vLLM's and nano-vllm's prefill is. The rows'
new tokens are concatenated into one sequence of T = sum(n_i) tokens, so the
linear layers (the cost) run once over [1, T, hidden]; each token keeps its
row's own positions (L_i + j), so RoPE is the lone extension's. Attention
is computed per row, on that row's own cache *in place*
(`headstart.engine.row_attention`): the scores of row i's queries against
its cached pieces (runs of pool blocks, `paged_kv`) and its n_i new keys (causally) are
softmaxed together and applied to the value pieces (rows of a few tokens:
one native kernel call per layer for all of them). No row's cached keys/values are copied:
not into a padded batch (`bench memory`), nor into one joined sequence; the
new keys/values are written into each row's blocks after the last layer.

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

from dataclasses import dataclass, field

import torch

from headstart.engine.kv import KVState, kept_logits
from headstart.engine.row_attention import layer_attention
from headstart.engine.paged_kv import PagedCache


@dataclass
class _Rows:
    """The rows still in the forward and where their tokens sit in the packed sequence."""

    rows: list[int]  # original row indices still running
    starts: list[int]  # packed offset of each running row's first new token
    counts: list[int]  # new tokens of each running row
    # new K/V per layer per original row: [1, kv_heads, n_i, head_dim]
    new_kv: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)


@torch.inference_mode()
def packed_forward(model, ops, invariant: bool, calls: list, capture: list | None = None) -> list[bool]:
    """`ModelRunner.extend_rows` with its model, ops and batch invariance given.

    `capture` (`ModelRunner.encode_rows`, table-block precompute): a list
    that gets each layer's (keys before RoPE, keys, values), packed
    `# [kv_heads, T, head_dim]` each; the rows' states are then left as they
    were (no cache written, no logits), and no fused layer runs (`ops`'
    parts do, so the keys before RoPE exist)."""
    decoder = model.model
    device = next(model.parameters()).device
    counts = [len(c.new_ids) for c in calls]
    starts = [sum(counts[:i]) for i in range(len(calls))]
    ids = torch.tensor([t for c in calls for t in c.new_ids], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(c.state.num_tokens, c.state.num_tokens + n, device=device)
                           for c, n in zip(calls, counts)])
    hidden = decoder.embed_tokens(ids[None])  # [1, T, hidden]
    cos, sin = decoder.rotary_emb(hidden, positions[None])
    fused = getattr(ops, "decoder_layer", None) if capture is None else None  # quant: a layer in one kernel call
    try:
        return _layers_and_head(model, ops, invariant, calls, _Rows(list(range(len(calls))), starts, counts),
                                hidden, cos, sin, fused, capture)
    finally:
        if fused is not None:
            ops.end_forward()  # a prefill's scratch goes back to the system


def _layers_and_head(model, ops, invariant: bool, calls: list, live: _Rows, hidden, cos, sin, fused,
                     capture: list | None) -> list[bool]:
    """The decoder layers over the packed rows `live`, then the head; updates the rows' states
    (or, with `capture`, gives it every layer's keys and values instead)."""
    decoder = model.model
    states = [c.state for c in calls]
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
        # NOTE: imported here: a GGUF model (the fused layer above) never needs transformers' modeling code
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        attn = layer.self_attn
        q, k, v = _by_row(lambda h: ops.qkv(index, h), live, invariant, hidden)
        shape = (1, hidden.shape[1], -1, attn.head_dim)
        q = q.view(shape).transpose(1, 2)  # [1, heads, T, head_dim]
        k = k.view(shape).transpose(1, 2)  # [1, kv_heads, T, head_dim]
        v = v.view(shape).transpose(1, 2)
        pre_rope = k
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if capture is not None:
            capture.append((pre_rope[0], k[0], v[0]))
        live.new_kv.append({})  # this layer's new keys/values per row, filled by layer_attention
        out = layer_attention(attn, states, index, q, k, v,
                              list(zip(live.rows, live.starts, live.counts)), live.new_kv[-1], ops)  # [T, heads*dim]
        hidden = _by_row(lambda o, h: ops.post(index, o, h), live, invariant, out[None], hidden)
    if capture is not None:  # an encoding forward: no state is written, no head runs
        return [True] * len(calls)
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
    if state.cache is None:  # a fresh cache: its blocks come from the pool at the first append
        state.cache = PagedCache()
    for layer, per_row in enumerate(new_kv):
        k, v = per_row[b]
        state.cache.append(layer, k, v)  # not `update`: it returns a joined copy of the cache
