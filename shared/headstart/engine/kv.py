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

from headstart.engine.paged_kv import PagedCache, layer_segments


def truncate_layers(cache: DynamicCache | None, length: int) -> None:
    """Undo a partial forward: layers that already appended new K/V past
    `length` tokens drop them (a failed or stopped extension)."""
    if cache is None:
        return
    if isinstance(cache, PagedCache):
        cache.crop_to(length)
        return
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.get_seq_length() > length:
            layer.crop(-(layer.get_seq_length() - length))


@dataclass
class KVState:
    """Token ids `ids` and their keys/values: `cache`, a block table over the
    pool (`paged_kv.PagedCache`; None: no tokens yet)."""

    ids: list[int] = field(default_factory=list)
    cache: PagedCache | None = None
    # logits after ids[-1] (vocab,), kept so a caught-up cache needs no forward
    last_logits: torch.Tensor | None = None

    def __post_init__(self):
        if self.cache is not None and not isinstance(self.cache, PagedCache):
            self.cache = paged(self.cache)

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    def crop(self, n: int) -> int:
        """Keep the first `n` tokens (the blocks past them go back to the pool).
        Returns how many tokens were dropped."""
        dropped = len(self.ids) - n
        if dropped <= 0:
            return 0
        if n == 0:
            self.cache = None
        else:
            self.cache.crop_to(n)
        del self.ids[n:]
        self.last_logits = None
        return dropped

    def block_tokens(self) -> tuple[int, int]:
        """(own, borrowed): tokens this state holds in blocks it allocated or
        copied, and in blocks it lists from the state it was shared from (a
        P0, a data session's live cache: that state counts them)."""
        own = borrowed = 0
        for _, tokens, is_borrowed in (self.cache.block_usage() if self.cache is not None else []):
            if is_borrowed:
                borrowed += tokens
            else:
                own += tokens
        return own, borrowed

    def nbytes(self) -> int:
        """Bytes of keys/values this state holds as its own: its tokens in the
        blocks it allocated or copied (a shared prefix, see `share`, is
        counted once, by the state it was shared from)."""
        private, _ = self.block_tokens()
        return private * self.token_bytes()

    def shared_nbytes(self) -> int:
        """Bytes of the tokens this state reads in blocks it borrowed (`share`: held once for all)."""
        _, shared = self.block_tokens()
        return shared * self.token_bytes()

    def token_bytes(self) -> int:
        """Keys and values of one token, every layer (0 without a cache)."""
        if self.cache is None or self.cache.pool is None:
            return 0
        return 2 * len(self.cache.layers) * self.cache.pool.kv_heads * self.cache.pool.head_dim \
            * torch.empty((), dtype=self.cache.pool.dtype).element_size()

    def share(self) -> "KVState":
        """A new state that starts from this one's tokens *without copying them*:
        its cache lists the same pool blocks, and its first write into one
        copies that block (`paged_kv`). How sessions and prefix requests start
        from a P0 and answers read a data session's live cache."""
        if self.cache is None:
            return KVState(list(self.ids), None, self.last_logits)
        return KVState(list(self.ids), self.cache.shared(), self.last_logits)

    def copy(self) -> "KVState":
        """A deep copy in blocks of its own."""
        if self.cache is None:
            return KVState(list(self.ids), None, self.last_logits)
        return KVState(list(self.ids), self.cache.copied(),
                       None if self.last_logits is None else self.last_logits.clone())


def paged(cache: DynamicCache) -> PagedCache:
    """A cache of plain layers (keys/values tensors) copied into pool blocks."""
    new = PagedCache()
    for index, layer in enumerate(cache.layers):
        for keys, values in layer_segments(layer):
            new.append(index, keys, values)
        new.layer(index)
    return new


def state_from_layers(ids: list[int], layers, last_logits: torch.Tensor | None = None) -> KVState:
    """A state over `ids` whose layer i holds `layers[i]` = (keys, values) `[1, kv_heads, tokens, head_dim]`, written into pool blocks."""
    cache = PagedCache()
    for index, (keys, values) in enumerate(layers):
        cache.append(index, keys, values)
    return KVState(ids, cache, last_logits)


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
