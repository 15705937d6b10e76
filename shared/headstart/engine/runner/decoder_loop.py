"""The runner's one forward path: the decoder loop over packed rows.

Only `ModelRunner` calls it (`extend_rows`, which `extend` and `prefill` are
a row of, and `encode_rows`), with its model, its ops and its batch
invariance (`tests/test_model_calls.py` checks nothing else imports it).

Layout: **packed** (varlen), as vLLM's and nano-vllm's prefill is. The rows'
new tokens are concatenated into one sequence of T = sum(n_i) tokens, so the
weight-bound parts (norms, projections, MLP: the runner's ops) run once over
`[1, T, hidden]` and the weights are read once for all rows; each token
keeps its row's own positions (L_i + j), so RoPE is the lone extension's.
Attention is per row, on the row's own cache read in place
(`runner.row_attention`); the new keys/values are written into each row's
blocks after the last layer.

Between layers each row's `should_abort` is polled; a row that asks leaves
(its tokens are dropped from the packed hidden states, its state is left
exactly as it was) and the others go on. The LM head runs only on the
positions whose logits a row wants.

Exactness: a row's attention, RoPE and positions are those of a lone
extension; the matrix products differ from it only in blocking (the packed
M), so a batched row equals its lone forward up to float reassociation, and
bit for bit with `invariant` (each row's products on its own tokens) or on
kernels whose sums do not depend on M (`native` up to its token bound, `quant`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headstart.engine.kv.paged_cache import PagedCache
from headstart.engine.kv.state import KVState, kept_logits
from headstart.engine.runner.row_attention import layer_attention
from headstart.engine.runner.rows import Row


@dataclass
class _Packed:
    """The rows still in the forward and where their tokens sit in the packed sequence."""

    running: list[int]  # indices (into the forward's rows) of the rows still running
    starts: list[int]  # packed offset of each running row's first new token
    counts: list[int]  # new tokens of each running row
    # new K/V per layer per row index: [1, kv_heads, n_i, head_dim]
    new_kv: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)

    def spans(self) -> list[tuple[int, int, int]]:
        """(row index, packed start, new tokens) of each running row, in packed order."""
        return list(zip(self.running, self.starts, self.counts))


@torch.inference_mode()
def run_decoder(model, ops, invariant: bool, rows: list[Row], capture: list | None = None) -> list[bool]:
    """`ModelRunner.extend_rows` with its model, ops and batch invariance given:
    True per row that ran, False per row that left.

    `capture` (`ModelRunner.encode_rows`, table-block precompute): a list
    that gets each layer's (keys before RoPE, keys, values), packed
    `# [kv_heads, T, head_dim]` each; the rows' states are then left as they
    were (no cache written, no logits), and no fused layer runs (the ops'
    parts do, so the keys before RoPE exist)."""
    decoder = model.model
    device = next(model.parameters()).device
    counts = [len(row.new_ids) for row in rows]
    starts = [sum(counts[:i]) for i in range(len(rows))]
    ids = torch.tensor([t for row in rows for t in row.new_ids], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(row.state.num_tokens, row.state.num_tokens + n, device=device)
                           for row, n in zip(rows, counts)])
    hidden = decoder.embed_tokens(ids[None])  # [1, T, hidden]
    cos, sin = decoder.rotary_emb(hidden, positions[None])
    fused = getattr(ops, "decoder_layer", None) if capture is None else None  # quant: a layer in one kernel call
    try:
        return _layers_and_head(model, ops, invariant, rows, _Packed(list(range(len(rows))), starts, counts),
                                hidden, cos, sin, fused, capture)
    finally:
        if fused is not None:
            ops.end_forward()  # a prefill's scratch goes back to the system


def _layers_and_head(model, ops, invariant: bool, rows: list[Row], live: _Packed, hidden, cos, sin, fused,
                     capture: list | None) -> list[bool]:
    """The decoder layers over the packed rows `live`, then the head; updates the rows' states
    (or, with `capture`, gives it every layer's keys and values instead)."""
    decoder = model.model
    states = [row.state for row in rows]
    for index, layer in enumerate(decoder.layers):
        leaving = _rows_leaving(live, rows)
        if len(leaving) == len(live.running):
            return [False] * len(rows)
        if leaving:
            hidden, cos, sin = _drop_rows(live, leaving, hidden, cos, sin)
        live.new_kv.append({})  # this layer's new keys/values per row
        if fused is not None:
            hidden = fused(index, hidden, cos, sin, live.spans(), states, live.new_kv[-1])
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
        out = layer_attention(attn, states, index, q, k, v, live.spans(), live.new_kv[-1], ops)  # [T, heads*dim]
        hidden = _by_row(lambda o, h: ops.post(index, o, h), live, invariant, out[None], hidden)
    if capture is not None:  # an encoding forward: no state is written, no head runs
        return [True] * len(rows)
    hidden = _by_row(decoder.norm, live, invariant, hidden)[0]  # [T, hidden]
    logits = _row_logits(model, ops, rows, live, hidden, invariant)
    for b in live.running:
        state = rows[b].state
        _append(state, live.new_kv, b)
        state.ids.extend(rows[b].new_ids)
        state.last_logits = logits.get(b)
    kept = set(live.running)
    return [b in kept for b in range(len(rows))]


def _rows_leaving(live: _Packed, rows: list[Row]) -> list[int]:
    """The running rows whose `should_abort` asks them to leave, before a layer."""
    return [b for b in live.running if rows[b].should_abort is not None and rows[b].should_abort()]


def _drop_rows(live: _Packed, leaving: list[int], hidden, cos, sin):
    keep = [i for i, b in enumerate(live.running) if b not in leaving]
    index = torch.tensor([t for i in keep for t in range(live.starts[i], live.starts[i] + live.counts[i])],
                         dtype=torch.long, device=hidden.device)
    running, counts = [live.running[i] for i in keep], [live.counts[i] for i in keep]
    live.running, live.counts = running, counts
    live.starts = [sum(counts[:i]) for i in range(len(counts))]
    return hidden.index_select(1, index), cos.index_select(1, index), sin.index_select(1, index)


def _by_row(fn, live: _Packed, invariant: bool, *packed: torch.Tensor):
    """`fn` over the packed tokens [1, T, ...]; in batch-invariant mode over
    each row's tokens alone, so every matrix product sees the M of the row's
    lone forward and reduces in the same order (at the cost of reading the
    weights once per row)."""
    if not invariant or len(live.running) == 1:
        return fn(*packed)
    parts = [fn(*(t[:, s:s + n] for t in packed)) for s, n in zip(live.starts, live.counts)]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(pieces, dim=1) for pieces in zip(*parts))
    return torch.cat(parts, dim=1)


def _row_logits(model, ops, rows: list[Row], live: _Packed, hidden, invariant: bool) -> dict[int, torch.Tensor]:
    """The LM head on the last position of each running row that wants logits (the last
    `logits_positions` of a row asking for several: into its `position_logits`)."""
    wanted = [(i, b, max(1, min(rows[b].logits_positions, live.counts[i])))
              for i, b in enumerate(live.running) if rows[b].want_logits]
    if not wanted:
        return {}
    index = [live.starts[i] + live.counts[i] - p + j for i, _, p in wanted for j in range(p)]
    picked = hidden.index_select(0, torch.tensor(index, device=hidden.device))  # [positions wanting logits, hidden]
    # batch-invariant: one position per call, as a lone extension's head runs
    logits = torch.cat([ops.head(picked[j:j + 1]) for j in range(len(index))]) if invariant else ops.head(picked)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # as the causal-LM classes that have it apply it (Gemma 2)
        logits = torch.tanh(logits / cap) * cap
    out, at = {}, 0
    for _, b, p in wanted:
        if p > 1:
            rows[b].position_logits = kept_logits(logits[at:at + p])
        out[b] = kept_logits(logits[at + p - 1])
        at += p
    return out


def _append(state: KVState, new_kv: list[dict], b: int) -> None:
    if state.cache is None:  # a fresh cache: its blocks come from the pool at the first append
        state.cache = PagedCache()
    for layer, per_row in enumerate(new_kv):
        k, v = per_row[b]
        state.cache.append(layer, k, v)
