"""One evolving KV cache and what is done to it without the model: crop, share, copy.

`KVState` holds the token ids `ids` whose keys/values are in `cache`, and the
logits after the last of them when the last extension ended there. Only the
worker thread touches a KVState (jobs prepare rows there and the worker runs
them, `headstart.engine.steps`): it is not thread-safe by design, one owner.

Extending a state runs the model: that is the `ModelRunner`'s job
(`headstart.engine.model_runner`), the only code that calls the model. What
is here never does: the states, the crop that undoes a partial forward
(`truncate_layers`), a row's extension as the runner takes it
(`RowExtension`) and the logits as a state keeps them (`kept_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from headstart.engine.shared_prefix import SharedPrefixLayer


def truncate_layers(cache: DynamicCache | None, length: int) -> None:
    """Undo a partial forward: layers that already appended new K/V past
    `length` tokens drop them (a failed or stopped extension)."""
    if cache is None:
        return
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.get_seq_length() > length:
            layer.crop(-(layer.get_seq_length() - length))


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
        """Bytes of keys/values this state holds privately (a shared prefix,
        see `share`, is counted once, where it is stored)."""
        if self.cache is None:
            return 0
        return sum(layer.private_nbytes if isinstance(layer, SharedPrefixLayer)
                   else layer.keys.nbytes + layer.values.nbytes for layer in self.cache.layers)

    def compact(self) -> None:
        """Drop the tails' spare room (`SharedPrefixLayer.compact`): for a cache kept, not extended."""
        for layer in self.cache.layers if self.cache is not None else []:
            if isinstance(layer, SharedPrefixLayer):
                layer.compact()

    def shared_nbytes(self) -> int:
        """Bytes of the shared prefix this state reads (held once for all its sharers)."""
        if self.cache is None:
            return 0
        return sum(layer.shared_nbytes for layer in self.cache.layers if isinstance(layer, SharedPrefixLayer))

    def shared_prefix(self) -> torch.Tensor | None:
        """The first layer's shared prefix keys (an identity for accounting), or None."""
        if self.cache is None or not self.cache.layers:
            return None
        layer = self.cache.layers[0]
        return layer.prefix_keys if isinstance(layer, SharedPrefixLayer) else None

    def share(self) -> "KVState":
        """A new state that starts from this one's tokens *without copying them*:
        its cache references these keys/values read-only and keeps its own
        extensions in a private tail (`SharedPrefixLayer`). How sessions and
        prefix requests start from a P0."""
        if self.cache is None:
            return KVState(list(self.ids), None, self.last_logits)
        new = DynamicCache()
        for layer in self.cache.layers:
            if isinstance(layer, SharedPrefixLayer):
                layer.mark_shared()  # its tail is now read in place by `new`
        new.layers = [SharedPrefixLayer(layer.keys, layer.values) for layer in self.cache.layers]
        return KVState(list(self.ids), new, self.last_logits)

    def copy(self) -> "KVState":
        """A deep copy (a private cache for a new session from a shared P0)."""
        if self.cache is None:
            return KVState(list(self.ids), None, self.last_logits)
        new = DynamicCache()
        new.layers = []
        for layer in self.cache.layers:
            private = SharedPrefixLayer(None, None)  # a tail that grows in place
            private.append(layer.keys, layer.values)  # copied into its own buffer
            new.layers.append(private)
        return KVState(list(self.ids), new, None if self.last_logits is None else self.last_logits.clone())


@dataclass
class RowExtension:
    """One state's extension as the runner takes it (`ModelRunner.extend_rows`):
    extend `state` by `new_ids`."""

    state: KVState
    new_ids: list[int]
    want_logits: bool = True
    should_abort: Callable[[], bool] | None = None
    logits_positions: int = 1  # the last positions whose logits are kept (into `position_logits`)
    position_logits: torch.Tensor | None = None


def kept_logits(logits: torch.Tensor) -> torch.Tensor:
    """The last logits as a KVState keeps them: float64 as they are
    (exactness tests), lower precisions widened to float32."""
    return logits if logits.dtype == torch.float64 else logits.float()
