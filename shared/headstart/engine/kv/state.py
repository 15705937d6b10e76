"""One evolving KV cache and what is done to it without the model: crop, share, copy.

`KVState` holds the token ids `ids` whose keys/values are in `cache`, and the
logits after the last of them when the last extension ended there. Only the
worker thread touches a KVState (jobs prepare rows there and the worker runs
them): it is not thread-safe by design, one owner. Extending a state runs
the model, which is the runner's job (`headstart.engine.runner`); nothing
here does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headstart.engine.kv.paged_cache import PagedCache


@dataclass
class KVState:
    """Token ids `ids` and their keys/values: `cache`, a block table over the
    pool (`kv.paged_cache.PagedCache`; None: no tokens yet)."""

    ids: list[int] = field(default_factory=list)
    cache: PagedCache | None = None
    # logits after ids[-1] (vocab,), kept so a caught-up cache needs no forward
    last_logits: torch.Tensor | None = None

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

    def undo_partial_forward(self) -> None:
        """Drop keys/values that a failed or stopped forward appended to some
        layers past `ids` (the cache then holds exactly `ids` again)."""
        if self.cache is not None:
            self.cache.crop_to(self.num_tokens)

    def segments(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Layer `layer`'s cached (keys, values) pieces, read in place (none without tokens)."""
        if self.cache is None or not self.ids:
            return []
        return self.cache.segments(layer)

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
        pool = self.cache.pool
        return 2 * self.cache.num_layers * pool.kv_heads * pool.head_dim * torch.empty((), dtype=pool.dtype).element_size()

    def share(self) -> "KVState":
        """A new state that starts from this one's tokens *without copying them*:
        its cache lists the same pool blocks, and its first write into one
        copies that block (`kv.paged_cache`). How sessions and prefix requests
        start from a P0 and answers read a data session's live cache."""
        if self.cache is None:
            return KVState(list(self.ids), None, self.last_logits)
        return KVState(list(self.ids), self.cache.shared(), self.last_logits)

    def copy(self) -> "KVState":
        """A deep copy in blocks of its own."""
        if self.cache is None:
            return KVState(list(self.ids), None, self.last_logits)
        return KVState(list(self.ids), self.cache.copied(),
                       None if self.last_logits is None else self.last_logits.clone())


def state_from_layers(ids: list[int], layers, last_logits: torch.Tensor | None = None) -> KVState:
    """A state over `ids` whose layer i holds `layers[i]` = (keys, values)
    `# [1, kv_heads, tokens, head_dim]`, written into pool blocks."""
    cache = PagedCache()
    for index, (keys, values) in enumerate(layers):
        cache.append(index, keys, values)
    return KVState(ids, cache, last_logits)


def kept_logits(logits: torch.Tensor) -> torch.Tensor:
    """The last logits as a KVState keeps them: float64 as they are
    (exactness tests), lower precisions widened to float32."""
    return logits if logits.dtype == torch.float64 else logits.float()
