"""One evolving KV cache and the three operations on it: crop, extend, copy.

`KVState` holds the token ids `ids` whose keys/values are in `cache`, and the
logits after the last of them when the last extension ended there. Only the
worker thread touches a KVState (it is not thread-safe by design: one owner).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache


@dataclass
class KVState:
    ids: list[int] = field(default_factory=list)
    cache: DynamicCache | None = None
    # logits after ids[-1] (vocab,), kept so a caught-up cache needs no forward
    last_logits: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    def crop(self, n: int) -> int:
        """Keep the first `n` tokens. Returns how many tokens were dropped."""
        dropped = len(self.ids) - n
        if dropped <= 0:
            return 0
        if n == 0:
            self.cache = None
        else:
            # transformers 5.x: crop(-k) removes k tokens
            self.cache.crop(-dropped)
        del self.ids[n:]
        self.last_logits = None
        return dropped

    def nbytes(self) -> int:
        if self.cache is None:
            return 0
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.cache.layers)

    def copy(self) -> "KVState":
        """A deep copy (a private cache for a new session from a shared P0)."""
        if self.cache is None:
            return KVState(list(self.ids), None, self.last_logits)
        new = DynamicCache()
        for i, layer in enumerate(self.cache.layers):
            new.update(layer.keys.clone(), layer.values.clone(), i)
        return KVState(list(self.ids), new, None if self.last_logits is None else self.last_logits.clone())


@torch.inference_mode()
def extend(model, state: KVState, new_ids: list[int], want_logits: bool = True) -> None:
    """Run the model over `new_ids` on top of `state`, appending their K/V.

    Positions continue from the cache length. Stores the logits after the
    last new token when `want_logits` (only the last position is computed).
    """
    if not new_ids:
        return
    if state.cache is None:
        state.cache = DynamicCache()
    device = next(model.parameters()).device
    input_ids = torch.tensor([new_ids], dtype=torch.long, device=device)
    out = model(input_ids=input_ids, past_key_values=state.cache, use_cache=True, logits_to_keep=1)
    state.ids.extend(new_ids)
    if want_logits:
        logits = out.logits[0, -1]
        # keep float64 logits as they are (exactness tests); widen low precision
        state.last_logits = logits if logits.dtype == torch.float64 else logits.float()
    else:
        state.last_logits = None


def prefill(model, ids: list[int]) -> KVState:
    """A cold prefill: a fresh cache over `ids` with the last logits."""
    state = KVState()
    extend(model, state, ids)
    return state
