"""Assemble a prompt's KV cache from table blocks and computed spans.

Walk the prompt left to right. A span covered by a block gets the block's
values and its keys rotated for their new positions (`rope.apply_rope`); a
span not covered (the template text, a table whose block is missing, the
question) is computed with a normal forward on top of everything placed so
far, so every computed token attends to all that precedes it, as in a full
prefill. Consecutive blocks are concatenated once per layer, not one by one.

The cache length always equals the number of tokens placed, so a later
forward (`ModelRunner.extend`) gets the right positions without being told.

The head (template text before the first table) is the same in every prompt
of a database: when the first computed span starts with it, a shared,
precomputed head state is copied instead of running the model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.kv.paged_cache import PagedCache
from headstart.engine.sched.extensions import Extension, ExtensionSteps, run_inline
from headstart.tables.block import TableBlock
from headstart.tables.rope import apply_rope


class AssemblyError(ValueError):
    """A block does not fit its span (token ids or length differ, spans overlap or run past the prompt)."""


@dataclass(frozen=True)
class PlacedBlock:
    """`block` placed at prompt positions [start, start + block.num_tokens)."""

    start: int
    block: TableBlock

    @property
    def end(self) -> int:
        return self.start + self.block.num_tokens


@dataclass(frozen=True)
class AssemblyStats:
    """Where the tokens of an assembled cache came from."""

    num_tokens: int
    num_block_tokens: int
    num_head_tokens: int  # copied from the shared head state
    num_computed_tokens: int
    num_forwards: int
    seconds: float


def assemble(
    runner: ModelRunner,
    prompt_ids: Sequence[int],
    placed: Sequence[PlacedBlock],
    *,
    head: KVState | None = None,
    upto: int | None = None,
) -> tuple[KVState, AssemblyStats]:
    """The cache of `prompt_ids[:upto]` (all of it by default) with `placed` blocks in it,
    the spans between them computed by `runner` here and now (`assemble_steps`, run inline).

    Raises:
        AssemblyError: a block's token ids differ from the prompt at its span,
            or two blocks overlap.
    """
    return run_inline(assemble_steps(runner.model, prompt_ids, placed, head=head, upto=upto), runner)


@torch.inference_mode()  # torch's decorator enters it at each resume of a generator
def assemble_steps(
    model,
    prompt_ids: Sequence[int],
    placed: Sequence[PlacedBlock],
    *,
    head: KVState | None = None,
    upto: int | None = None,
) -> ExtensionSteps[tuple[KVState, AssemblyStats]]:
    """`assemble` as steps (`engine.steps.Extension`): blocks placed (their keys rotated by
    `model`'s rotary table) inline, and each span between them yielded as a forward, so a
    worker plans it as a row; returns the state and its stats.

    Blocks that end after `upto` are left out (their tokens are not needed).
    The state's `last_logits` are set when the last span was computed, else None.

    Raises:
        AssemblyError: a block's token ids differ from the prompt at its span,
            or two blocks overlap.
    """
    started = time.perf_counter()
    upto = len(prompt_ids) if upto is None else upto
    state = KVState()
    counts = {"block": 0, "head": 0, "computed": 0, "forwards": 0}
    pending: list[PlacedBlock] = []
    pos = 0
    for item in sorted(placed, key=lambda p: p.start):
        if item.end > upto:
            break
        if item.start < pos:
            raise AssemblyError(f"block {item.block.table!r} at {item.start} overlaps the span before it (ends {pos})")
        if tuple(prompt_ids[item.start:item.end]) != item.block.token_ids:
            raise AssemblyError(f"block {item.block.table!r} does not match the prompt at {item.start}")
        if item.start > pos:
            _place(model, state, pending)
            pending = []
            yield from _compute(state, prompt_ids, pos, item.start, head, counts)
        pending.append(item)
        counts["block"] += item.block.num_tokens
        pos = item.end
    _place(model, state, pending)
    if pos < upto:
        yield from _compute(state, prompt_ids, pos, upto, head, counts)
    stats = AssemblyStats(len(state.ids), counts["block"], counts["head"], counts["computed"], counts["forwards"],
                          time.perf_counter() - started)
    return state, stats


def _place(model, state: KVState, blocks: Sequence[PlacedBlock]) -> None:
    """Append consecutive blocks to the cache: each block's keys re-rotated to its place, written into pool blocks."""
    if not blocks:
        return
    keys = [apply_rope(model, p.block.keys_pre_rope, p.start) for p in blocks]  # each [layers, kv_heads, T, D]
    if state.cache is None:
        state.cache = PagedCache()
    for layer in range(keys[0].shape[0]):
        for p, kk in zip(blocks, keys):  # each block's span written into the cache's pool blocks
            state.cache.append(layer, kk[layer].unsqueeze(0), p.block.values[layer].unsqueeze(0))
    for p in blocks:
        state.ids.extend(p.block.token_ids)
    state.last_logits = None


def _compute(state: KVState, prompt_ids: Sequence[int], start: int, end: int, head: KVState | None,
             counts: dict[str, int]) -> ExtensionSteps[None]:
    """The forward over prompt_ids[start:end] on top of the state (the head copied when it applies)."""
    if start == 0 and head is not None and head.ids and len(head.ids) <= end \
            and list(prompt_ids[:len(head.ids)]) == head.ids:
        copy = head.copy()
        state.ids, state.cache, state.last_logits = copy.ids, copy.cache, copy.last_logits
        counts["head"] += len(head.ids)
        start = len(head.ids)
    if start < end:
        yield Extension(state, list(prompt_ids[start:end]))
        counts["computed"] += end - start
        counts["forwards"] += 1
