"""The padded batched forward the model runner replaced, kept only so
`bench memory` can measure what it cost (from main at 2ca5549,
`batching.extend_rows`, without its rows-leaving hooks).

Every row's cache (length L_i) is copied left-aligned into one batch cache of
[rows, kv_heads, max L, head_dim] per layer, the new tokens follow at max L,
and a 4-D mask lets row i see its own L_i keys and its new tokens causally.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


@torch.inference_mode()
def padded_extend_rows(model, states, news) -> list[torch.Tensor]:
    """One padded forward over `states` extended by `news`; returns each row's
    last logits (the states are not changed: only the forward is measured)."""
    # a GGUF model's module tree runs its forwards in the kernels: transformers' forward is its view
    model = model.hf_view() if hasattr(model, "hf_view") else model
    device = next(model.parameters()).device
    lengths, counts = [s.num_tokens for s in states], [len(n) for n in news]
    batch, max_len, max_new = len(states), max(lengths), max(counts)
    input_ids = torch.zeros((batch, max_new), dtype=torch.long, device=device)
    positions = torch.zeros((batch, max_new), dtype=torch.long, device=device)
    mask = torch.zeros((batch, 1, max_new, max_len + max_new), dtype=torch.bool, device=device)
    causal = torch.tril(torch.ones((max_new, max_new), dtype=torch.bool, device=device))
    for b, (new, length, count) in enumerate(zip(news, lengths, counts)):
        input_ids[b, :count] = torch.tensor(new, dtype=torch.long, device=device)
        input_ids[b, count:] = new[-1]
        positions[b] = torch.arange(length, length + max_new, device=device)
        mask[b, 0, :, :length] = True
        mask[b, 0, :, max_len:] = causal
        mask[b, 0, :, max_len + count:] = False
    cache = DynamicCache()
    for i, ref in enumerate(states[0].cache.layers):
        keys = ref.keys.new_zeros((batch, ref.keys.shape[1], max_len, ref.keys.shape[3]))
        values = ref.values.new_zeros((batch, ref.values.shape[1], max_len, ref.values.shape[3]))
        for b, (state, length) in enumerate(zip(states, lengths)):
            keys[b, :, :length] = state.cache.layers[i].keys[0]
            values[b, :, :length] = state.cache.layers[i].values[0]
        cache.update(keys, values, i)
    # NOTE: the measured baseline calls the model itself, outside the ModelRunner, on purpose
    hidden = model.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         past_key_values=cache, use_cache=True).last_hidden_state
    last = torch.tensor([c - 1 for c in counts], device=device)
    return list(model.lm_head(hidden[torch.arange(batch, device=device), last]))
