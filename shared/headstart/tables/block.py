"""`TableBlock`: the precomputed KV of one table, as stored and moved between tiers.

A block is produced once per (model, dtype, database, schema version, table)
by the precompute job, which encodes each foreign-key group of tables as one
causal sequence in schema order (`layout`). The block of a table keeps:

- the table's token ids (what the table trie matches in a prompt),
- its keys *before* rotary position encoding (so it can be placed at any
  position later) and its values,
- where it sat when encoded: the group, the tables of the group in encode
  order and the position of its first token in that sequence.

Blocks are immutable by convention: tiers share the same tensors, nobody
writes into them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from headstart.tables.keys import BlockId, BlockKey


class BlockError(ValueError):
    """A block's fields disagree with each other (shape, dtype, token count)."""


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> `"bfloat16"`: the dtype string used in keys and metadata."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, eq=False)
class TableBlock:
    """Precomputed KV of one table (see module docstring).

    Raises:
        BlockError: on construction, when tensor shapes, the dtype string or
            the number of token ids disagree.
    """

    model_id: str
    dtype: str
    db_id: str
    schema_hash: str
    table: str
    token_ids: tuple[int, ...]
    keys_pre_rope: torch.Tensor  # [layers, kv_heads, tokens, head_dim]
    values: torch.Tensor  # [layers, kv_heads, tokens, head_dim]
    group: int = 0
    group_tables: tuple[str, ...] = ()
    position_offset: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k, v = self.keys_pre_rope, self.values
        if k.dim() != 4:
            raise BlockError(f"{self.table}: keys must be [layers, kv_heads, tokens, head_dim], got {tuple(k.shape)}")
        if k.shape != v.shape:
            raise BlockError(f"{self.table}: keys {tuple(k.shape)} and values {tuple(v.shape)} differ")
        if k.dtype != v.dtype or dtype_name(k.dtype) != self.dtype:
            raise BlockError(
                f"{self.table}: dtype {self.dtype!r} but keys {dtype_name(k.dtype)}, values {dtype_name(v.dtype)}"
            )
        if k.shape[2] != len(self.token_ids):
            raise BlockError(f"{self.table}: {len(self.token_ids)} token ids for {k.shape[2]} KV positions")
        if not self.token_ids:
            raise BlockError(f"{self.table}: a block needs at least one token")
        if self.position_offset < 0 or self.group < 0:
            raise BlockError(f"{self.table}: group and position_offset must be >= 0")
        if self.group_tables and self.table not in self.group_tables:
            raise BlockError(f"{self.table}: not among its group's tables {self.group_tables}")

    @property
    def block_id(self) -> BlockId:
        return BlockId(self.model_id, self.dtype, self.db_id, self.schema_hash, self.table)

    @property
    def key(self) -> BlockKey:
        return self.block_id.key

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_bytes(self) -> int:
        """Bytes of KV tensors: what a tier's capacity counts."""
        k, v = self.keys_pre_rope, self.values
        return k.numel() * k.element_size() + v.numel() * v.element_size()

    @property
    def device(self) -> torch.device:
        return self.keys_pre_rope.device

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> "TableBlock":
        """The same block with its tensors on `device` (self when already there)."""
        device = torch.device(device)
        if self.device == device:
            return self
        return replace(
            self,
            keys_pre_rope=self.keys_pre_rope.to(device, non_blocking=non_blocking),
            values=self.values.to(device, non_blocking=non_blocking),
        )
