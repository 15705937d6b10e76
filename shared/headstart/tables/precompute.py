"""Block precompute: encode each group of tables once and store one block per table.

For every group of a `TableLayout` (a foreign-key group in schema order,
or a single table in `independent` mode) one causal forward runs over

    head + table_1 + table_2 + ... + table_k

so each table attends to the head and to its group's tables listed before it. The
forward is the engine's `ModelRunner.encode_rows` (the runner's one decoder
loop, with the model's own modules): each table's keys come back before rotary
encoding, with its values, and both are stored with its token ids and its
position in that sequence (`position_offset`).

Small groups (every table alone in `independent` mode, single tables of a
`pfk` schema) are encoded several at a time in one forward, each its own row
from position 0; a row's bits do not depend on the rows beside it (the
runner runs each row's products alone), so a block is its group's lone cold
prefill.

`iter_precompute` is the job: it yields once per group (one forward per batch
of groups), so the engine can run it on its forward worker between other
work and a CLI can draw a progress bar. It must run where the model runs (the
worker thread in an engine process), with that process's runner.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from headstart.engine.runner.model_runner import ModelRunner
from headstart.tables.block import TableBlock
from headstart.tables.layout import TableLayout
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


@torch.inference_mode()  # the blocks' copies are cut from the forward's inference tensors
def encode_groups(runner: ModelRunner, layout: TableLayout,
                  group_indices: Sequence[int]) -> dict[int, list[TableBlock]]:
    """Blocks of several groups from one forward of `runner`
    (`ModelRunner.encode_rows`: one row per group)."""
    seqs = [layout.group_sequence(layout.groups[g]) for g in group_indices]
    encoded = runner.encode_rows([ids for ids, _ in seqs])  # [layer][row]: [kv_heads, row's tokens, head_dim]
    return {g: _blocks(layout, g, offsets, [k[row] for k in encoded.keys_pre_rope], [v[row] for v in encoded.values])
            for row, (g, (_, offsets)) in enumerate(zip(group_indices, seqs))}


def encode_group(runner: ModelRunner, layout: TableLayout, group_index: int) -> list[TableBlock]:
    """Blocks of one group's tables, from one forward over head + the group's tables."""
    return encode_groups(runner, layout, [group_index])[group_index]


def _blocks(layout: TableLayout, group_index: int, offsets: dict[str, int], keys: list[torch.Tensor],
            values: list[torch.Tensor]) -> list[TableBlock]:
    """Cut one row's per-layer keys/values `# [kv_heads, width, head_dim]` into its tables' blocks."""
    group, scope = layout.groups[group_index], layout.scope
    blocks = []
    for name in group:
        start, n = offsets[name], len(layout.texts[name].ids)
        # stack copies: the block does not keep the batch's tensors alive
        k = torch.stack([layer[:, start:start + n] for layer in keys])  # [layers, kv_heads, n, head_dim]
        v = torch.stack([layer[:, start:start + n] for layer in values])
        blocks.append(TableBlock(
            model_id=scope.model_id, dtype=scope.dtype, db_id=scope.db_id, schema_hash=scope.schema_hash,
            table=name, token_ids=layout.texts[name].ids, keys_pre_rope=k, values=v,
            group=group_index, group_tables=tuple(group), position_offset=start,
            extra={"mode": layout.mode},
        ))
    return blocks


def iter_precompute(runner: ModelRunner, layout: TableLayout, store: BlockStore, *, skip_existing: bool = True,
                    max_batch_tokens: int = 2048) -> Iterator[GroupProgress]:
    """Encode and store every group of `layout`, yielding after each (see module docstring).

    Args:
        runner: the model's runner (its `encode_rows` runs every forward).
        skip_existing: leave a group alone when the store already has all its blocks.
        max_batch_tokens: groups are encoded together while rows x longest row
            stays within this (small groups, e.g. every table alone, then cost
            one forward instead of one each); a longer group runs alone.
    """
    num_groups = len(layout.groups)
    todo = []
    for index, group in enumerate(layout.groups):
        started = time.perf_counter()
        if skip_existing and all(store.contains(layout.scope.block_id(name)) for name in group):
            yield GroupProgress(layout.db_id, index, num_groups, tuple(group), 0, 0, True,
                                time.perf_counter() - started)
        else:
            todo.append(index)
    for batch in _batches(layout, todo, max_batch_tokens):
        started = time.perf_counter()
        encoded = encode_groups(runner, layout, batch)
        seconds = (time.perf_counter() - started) / len(batch)
        for index in batch:
            for block in encoded[index]:
                store.put(block)
            group = layout.groups[index]
            yield GroupProgress(layout.db_id, index, num_groups, tuple(group), len(layout.group_sequence(group)[0]),
                                sum(b.num_bytes for b in encoded[index]), False, seconds)


def _batches(layout: TableLayout, indices: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive groups packed while (rows x longest row) <= max_tokens."""
    batches: list[list[int]] = []
    width = 0
    for index in indices:
        n = len(layout.group_sequence(layout.groups[index])[0])
        if batches and max(width, n) * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(index)
            width = max(width, n)
        else:
            batches.append([index])
            width = n
    return batches
