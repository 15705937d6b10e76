"""Tiny table blocks for tests: 2 layers, 1 KV head, head_dim 4, values from a seed."""

from __future__ import annotations

import uuid

import torch

from headstart.tables.block import TableBlock, dtype_name
from headstart.tables.keys import BlockScope

LAYERS, KV_HEADS, HEAD_DIM = 2, 1, 4


def fresh_scope(dtype: torch.dtype = torch.float32) -> BlockScope:
    """A scope no other test uses (uuid model id), so a shared Redis needs no flushing."""
    return BlockScope(f"test-model/{uuid.uuid4().hex[:12]}", dtype_name(dtype), "concert_singer", "ab" * 32)


def make_block(
    scope: BlockScope,
    table: str,
    num_tokens: int = 3,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    group: int = 0,
    position_offset: int = 0,
) -> TableBlock:
    """A block of `num_tokens` tokens (ids seed*100+i) with seeded random KV."""
    g = torch.Generator().manual_seed(seed)
    shape = (LAYERS, KV_HEADS, num_tokens, HEAD_DIM)  # [layers, kv_heads, tokens, head_dim]
    return TableBlock(
        model_id=scope.model_id,
        dtype=dtype_name(dtype),
        db_id=scope.db_id,
        schema_hash=scope.schema_hash,
        table=table,
        token_ids=tuple(seed * 100 + i for i in range(num_tokens)),
        keys_pre_rope=torch.randn(shape, generator=g).to(dtype),
        values=torch.randn(shape, generator=g).to(dtype),
        group=group,
        group_tables=(table,),
        position_offset=position_offset,
    )


def block_bytes(num_tokens: int, dtype: torch.dtype = torch.float32) -> int:
    """`num_bytes` of a `make_block` block: keys + values."""
    return 2 * LAYERS * KV_HEADS * num_tokens * HEAD_DIM * torch.tensor([], dtype=dtype).element_size()
