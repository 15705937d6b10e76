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

TAIL_MIN_TOKENS = 64  # the first buffer of a tail


class SharedPrefixLayer(DynamicLayer):
    """One layer's keys/values: `prefix_*` shared (read-only), `tail_*` private.
    Shapes `# [1, kv_heads, tokens, head_dim]`.

    The tail grows in a buffer with room to spare (a quarter), so appending a
    decode step's token copies that token, not the whole tail; `tail_*` are
    views of the buffer's used part. A view handed to another cache (`share`)
    is never written again: after a crop below what was shared, the next
    append moves the tail to a new buffer first."""

    def __init__(self, prefix_keys: torch.Tensor | None, prefix_values: torch.Tensor | None):
        super().__init__()  # sets keys/values to None through the setters below
        self.prefix_keys, self.prefix_values = prefix_keys, prefix_values
        if prefix_keys is not None:
            self.dtype, self.device = prefix_keys.dtype, prefix_keys.device
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # [1, kv_heads, capacity, head_dim] each
        self._shared_upto = 0  # tail tokens another cache reads in place
        self.is_initialized = True

    # `keys`/`values` as transformers reads them: the whole sequence. Assigning
    # one (a caller outside this class) makes the layer private from then on.
    @property
    def keys(self) -> torch.Tensor | None:
        return _joined(self.prefix_keys, self.tail_keys)

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self.prefix_keys, self.tail_keys = None, value
        self._buffers, self._shared_upto = None, 0  # the tail is `value` now, in no buffer of ours

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
        """The tail's keys/values (what the KV budget counts; the buffer's spare room, at most
        TAIL_MIN_TOKENS tokens and a quarter of the tail, is not)."""
        return 0 if self.tail_keys is None else self.tail_keys.nbytes + self.tail_values.nbytes

    def compact(self) -> None:
        """Drop the spare room (a cache that is kept, not extended: a stored P0)."""
        if self._buffers is not None and self.tail_keys is not None and self._buffers[0].shape[-2] > self.tail_keys.shape[-2]:
            self.tail_keys, self.tail_values = self.tail_keys.contiguous(), self.tail_values.contiguous()
            self._buffers = (self.tail_keys, self.tail_values)

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
        used = 0 if self.tail_keys is None else self.tail_keys.shape[-2]
        new = key_states.shape[-2]
        buffers = self._buffers
        if buffers is None or used + new > buffers[0].shape[-2] or used < self._shared_upto:
            # room for TAIL_MIN_TOKENS more (a decode step's tokens), growing by a quarter as it fills
            capacity = used + new + max(TAIL_MIN_TOKENS, (used + new) // 4)
            buffers = tuple(self._grown(t, old, capacity) for t, old in ((key_states, self.tail_keys),
                                                                         (value_states, self.tail_values)))
            self._buffers, self._shared_upto = buffers, 0
        keys, values = buffers
        keys[..., used:used + new, :] = key_states
        values[..., used:used + new, :] = value_states
        self.tail_keys, self.tail_values = keys[..., :used + new, :], values[..., :used + new, :]
        self.dtype, self.device = keys.dtype, keys.device

    @staticmethod
    def _grown(new: torch.Tensor, old: torch.Tensor | None, capacity: int) -> torch.Tensor:
        buffer = new.new_empty(*new.shape[:-2], capacity, new.shape[-1])
        if old is not None and old.shape[-2]:
            buffer[..., :old.shape[-2], :] = old
        return buffer

    def mark_shared(self) -> None:
        """Another cache now reads this tail in place: never write what it holds again."""
        if self.tail_keys is not None:
            self._shared_upto = max(self._shared_upto, self.tail_keys.shape[-2])

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
        self._buffers, self._shared_upto = None, 0


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
