"""Block precompute: encode each group of tables once and store one block per table.

For every group of a `TableLayout` (a foreign-key group in topological order,
or a single table in `independent` mode) one causal forward runs over

    head + table_1 + table_2 + ... + table_k

so each table attends to the head and to the tables it references. Each
table's keys are captured before rotary encoding (`rope.capture_pre_rope_keys`),
its values read from the cache, and both stored with its token ids and its
position in that sequence (`position_offset`).

`iter_precompute` is the job: one group per step, so the engine can run it on
its forward worker between other work and a CLI can draw a progress bar. It
must run where the model runs (the worker thread in an engine process).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from headstart.tables.block import TableBlock
from headstart.tables.layout import TableLayout
from headstart.tables.rope import capture_pre_rope_keys
from headstart.tables.store.base import BlockStore


@dataclass(frozen=True)
class GroupProgress:
    """One group done: encoded and stored, or skipped because every block was already stored."""

    db_id: str
    group_index: int
    num_groups: int
    tables: tuple[str, ...]
    num_tokens: int
    num_bytes: int
    skipped: bool
    seconds: float


@dataclass(frozen=True)
class PrecomputeReport:
    """What a precompute run did for one database."""

    db_id: str
    mode: str
    num_groups: int
    num_tables: int
    num_groups_encoded: int
    num_groups_skipped: int
    num_tokens_encoded: int
    num_bytes_stored: int
    seconds: float

    @classmethod
    def from_progress(cls, layout: TableLayout, steps: Sequence[GroupProgress]) -> "PrecomputeReport":
        encoded = [s for s in steps if not s.skipped]
        return cls(
            layout.db_id, layout.mode, len(layout.groups), len(layout.texts), len(encoded),
            len(steps) - len(encoded), sum(s.num_tokens for s in encoded), sum(s.num_bytes for s in encoded),
            sum(s.seconds for s in steps),
        )


@torch.inference_mode()
def encode_group(model, layout: TableLayout, group_index: int) -> list[TableBlock]:
    """Blocks of one group's tables, from one forward over head + the group's tables."""
    group = layout.groups[group_index]
    ids, offsets = layout.group_sequence(group)
    device = next(model.parameters()).device
    with capture_pre_rope_keys(model) as keys:
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    num_layers = len(keys)
    scope = layout.scope
    blocks = []
    for name in group:
        start, n = offsets[name], len(layout.texts[name].ids)
        # stack copies: the block does not keep the group's tensors alive
        k = torch.stack([keys[i][0, :, start:start + n] for i in range(num_layers)])  # [layers, kv_heads, n, head_dim]
        v = torch.stack([cache.layers[i].values[0, :, start:start + n] for i in range(num_layers)])
        blocks.append(TableBlock(
            model_id=scope.model_id, dtype=scope.dtype, db_id=scope.db_id, schema_hash=scope.schema_hash,
            table=name, token_ids=layout.texts[name].ids, keys_pre_rope=k, values=v,
            group=group_index, group_tables=tuple(group), position_offset=start,
            extra={"mode": layout.mode},
        ))
    return blocks


def iter_precompute(model, layout: TableLayout, store: BlockStore, *,
                    skip_existing: bool = True) -> Iterator[GroupProgress]:
    """Encode and store every group of `layout`, yielding after each (see module docstring).

    Args:
        skip_existing: leave a group alone when the store already has all its blocks.
    """
    num_groups = len(layout.groups)
    for index, group in enumerate(layout.groups):
        start = time.perf_counter()
        ids = [layout.scope.block_id(name) for name in group]
        if skip_existing and all(store.contains(block_id) for block_id in ids):
            yield GroupProgress(layout.db_id, index, num_groups, tuple(group), 0, 0, True, time.perf_counter() - start)
            continue
        blocks = encode_group(model, layout, index)
        for block in blocks:
            store.put(block)
        num_tokens = len(layout.group_sequence(group)[0])
        yield GroupProgress(layout.db_id, index, num_groups, tuple(group), num_tokens,
                            sum(b.num_bytes for b in blocks), False, time.perf_counter() - start)
