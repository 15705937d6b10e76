"""A cache layer over a shared, read-only prefix (P0) and a private tail.

Every session on a database starts from the same P0 cache (the system
prompt and schema: hundreds to thousands of tokens). Deep-copying it per
session multiplies the largest part of every cache by the number of
sessions. A `SharedPrefixLayer` instead references P0's key/value tensors
(never written: transformers' cache layers grow by `torch.cat` into new
tensors and crop by slicing, so a shared tensor is never changed in place)
and keeps only the session's own tokens in a private tail.

Attention needs the layer's keys as one sequence: the model's own attention
reads `keys` (P0 and the tail joined: a transient copy of one layer, freed
after that layer's attention), the batched runner reads `segments()` and
attends to each piece in place (`model_runner`). A crop into P0 keeps a
slice of it (a view: still shared) and drops the tail.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class SharedPrefixLayer(DynamicLayer):
    """One layer's keys/values: `prefix_*` shared (read-only), `tail_*` private.
    Shapes `# [1, kv_heads, tokens, head_dim]`."""

    def __init__(self, prefix_keys: torch.Tensor, prefix_values: torch.Tensor):
        super().__init__()  # sets keys/values to None through the setters below
        self.prefix_keys, self.prefix_values = prefix_keys, prefix_values
        self.dtype, self.device = prefix_keys.dtype, prefix_keys.device
        self.is_initialized = True

    # `keys`/`values` as transformers reads them: the whole sequence. Assigning
    # one (a caller outside this class) makes the layer private from then on.
    @property
    def keys(self) -> torch.Tensor | None:
        return _joined(self.prefix_keys, self.tail_keys)

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self.prefix_keys, self.tail_keys = None, value

    @property
    def values(self) -> torch.Tensor | None:
        return _joined(self.prefix_values, self.tail_values)

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self.prefix_values, self.tail_values = None, value

    def segments(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (keys, values) pieces in order, without joining them."""
        pieces = [(self.prefix_keys, self.prefix_values), (self.tail_keys, self.tail_values)]
        return [(k, v) for k, v in pieces if k is not None and k.shape[-2]]

    def get_seq_length(self) -> int:
        return sum(k.shape[-2] for k, _ in self.segments())

    @property
    def private_nbytes(self) -> int:
        return 0 if self.tail_keys is None else self.tail_keys.nbytes + self.tail_values.nbytes

    @property
    def shared_nbytes(self) -> int:
        return 0 if self.prefix_keys is None else self.prefix_keys.nbytes + self.prefix_values.nbytes

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """transformers' contract: append, then return the whole sequence (a
        joined copy of P0 and the tail, for the model's own attention)."""
        self.append(key_states, value_states)
        return self.keys, self.values

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Append to the private tail only. The batched runner attends to the
        pieces in place, so it appends through here: `update`'s joined copy of
        P0 (every layer, every row, every forward) would be made and dropped."""
        if self.tail_keys is None:
            self.tail_keys, self.tail_values = key_states, value_states
        else:
            self.tail_keys = torch.cat([self.tail_keys, key_states], dim=-2)
            self.tail_values = torch.cat([self.tail_values, value_states], dim=-2)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        keep = self.get_seq_length() + tokens_to_remove
        prefix = 0 if self.prefix_keys is None else self.prefix_keys.shape[-2]
        if keep >= prefix:
            tail = keep - prefix
            if self.tail_keys is not None:
                self.tail_keys = self.tail_keys[..., :tail, :] if tail else None
                self.tail_values = self.tail_values[..., :tail, :] if tail else None
            return
        self.prefix_keys = self.prefix_keys[..., :keep, :]  # a view: still shared, never written
        self.prefix_values = self.prefix_values[..., :keep, :]
        self.tail_keys = self.tail_values = None


def _joined(prefix: torch.Tensor | None, tail: torch.Tensor | None) -> torch.Tensor | None:
    if prefix is None:
        return tail
    if tail is None:
        return prefix
    return torch.cat([prefix, tail], dim=-2)


def layer_segments(layer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (keys, values) pieces of any cache layer (one for a plain layer)."""
    if isinstance(layer, SharedPrefixLayer):
        return layer.segments()
    if not getattr(layer, "is_initialized", False) or layer.keys is None or not layer.keys.shape[-2]:
        return []
    return [(layer.keys, layer.values)]
