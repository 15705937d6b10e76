"""Precompute and assembly on a float64 random:tiny model: blocks hold what the forward saw,
assembly puts them back where a prefill would have them, computed spans attend to all before."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.runner.model_runner import ModelRunner
from headstart.models import load_model
from headstart.prompt import PromptBuilder
from headstart.schema.resolve import resolve_database
from headstart.tables.assemble import AssemblyError, PlacedBlock, assemble
from headstart.tables.device_tier import DeviceTier
from headstart.tables.layout import TableLayout
from headstart.tables.precompute import encode_group, encode_groups
from headstart.tables.service import TableCacheService
from headstart.tables.store import MemoryStore

QUESTION = "How many singers are there?"


@pytest.fixture(scope="module")
def loaded():
    return load_model("random:tiny", "float64")


@pytest.fixture(scope="module")
def runner(loaded):
    """The model's forwards: its own (Hugging Face) forward, as the engine's `off`."""
    return ModelRunner(loaded.model)


@pytest.fixture(scope="module")
def prompts(loaded):
    return {db: PromptBuilder(loaded.tokenizer, resolve_database(db).schema)
            for db in ("concert_singer", "world_1", "pets_1")}


def service(loaded, mode="pfk", capacity=1 << 30) -> TableCacheService:
    return TableCacheService(loaded, mode=mode, store=MemoryStore(), tier=DeviceTier(capacity))


def max_diff(a, b) -> float:
    return max(float((x.keys - y.keys).abs().max()) + float((x.values - y.values).abs().max())
               for x, y in zip(a.cache.layers, b.cache.layers))


def test_blocks_hold_the_group_forward(loaded, runner, prompts):
    layout = TableLayout.build(prompts["concert_singer"], model_id=loaded.model_id, dtype="float64", mode="pfk")
    blocks = encode_group(runner, layout, 0)
    ids, offsets = layout.group_sequence(layout.groups[0])
    full = runner.prefill(ids)
    assert [b.table for b in blocks] == ["stadium", "singer", "concert", "singer_in_concert"]
    for block in blocks:
        start, n = offsets[block.table], block.num_tokens
        assert block.position_offset == start and block.token_ids == tuple(ids[start:start + n])
        assert block.group_tables == layout.groups[0] and block.extra == {"mode": "pfk"}
        assert block.keys_pre_rope.shape == (2, 2, n, 8) and block.keys_pre_rope.is_contiguous()
        for i, layer in enumerate(full.cache.layers):
            assert torch.equal(block.values[i], layer.values[0, :, start:start + n])


def test_batched_groups_encode_as_alone(loaded, runner, prompts):
    """Right padding changes no real token: batched blocks equal one-group blocks up to rounding."""
    layout = TableLayout.build(prompts["concert_singer"], model_id=loaded.model_id, dtype="float64",
                               mode="independent")
    batched = encode_groups(runner, layout, [0, 1, 2, 3])
    for index in range(4):
        (alone,), (packed,) = encode_group(runner, layout, index), batched[index]
        assert (packed.table, packed.token_ids, packed.position_offset) == \
            (alone.table, alone.token_ids, alone.position_offset)
        torch.testing.assert_close(packed.keys_pre_rope, alone.keys_pre_rope, rtol=0, atol=1e-12)
        torch.testing.assert_close(packed.values, alone.values, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode,expected_groups", [("pfk", 1), ("independent", 4)])
def test_precompute_stores_every_table_once_and_skips_what_is_stored(loaded, runner, prompts, mode, expected_groups):
    svc = service(loaded, mode)
    layout = svc.layout("concert_singer", prompts["concert_singer"])
    first = svc.precompute(layout, runner)
    again = svc.precompute(layout, runner)
    assert (first.num_groups, first.num_groups_encoded, first.num_groups_skipped) == (expected_groups,) * 2 + (0,)
    assert (again.num_groups_encoded, again.num_groups_skipped) == (0, expected_groups)
    assert svc.store.list(layout.scope) == sorted(layout.texts)
    assert svc.missing_tables(layout) == []


def test_schema_order_single_group_assembles_to_the_prefill(loaded, runner, prompts):
    """concert_singer is one foreign-key group whose topological order is the schema order:
    assembling its P0 from blocks gives the prefill's cache up to float64 rounding."""
    svc = service(loaded)
    prompt = prompts["concert_singer"]
    layout = svc.layout("concert_singer", prompt)
    svc.precompute(layout, runner)
    blocks = svc.load(svc.plan(layout, prompt.base_ids))
    state, stats = svc.assemble(blocks, runner, compute_tail=True)
    svc.release(blocks)
    reference = runner.prefill(prompt.base_ids)
    assert state.ids == reference.ids
    assert max_diff(state, reference) < 1e-12
    assert torch.allclose(state.last_logits, reference.last_logits, atol=1e-12, rtol=0)
    head, blocks_tokens = len(layout.head_ids), layout.num_block_tokens
    assert (stats.num_head_tokens, stats.num_block_tokens, stats.num_computed_tokens, stats.num_forwards) == \
        (head, blocks_tokens, len(prompt.base_ids) - head - blocks_tokens, 1)


@pytest.mark.parametrize("db", ["world_1", "pets_1"])
def test_group_whose_topological_order_is_not_the_schema_order_assembles_to_the_prefill(loaded, runner, prompts, db):
    """Issue 30: pets_1 lists Has_Pet before Pets, which it references; world_1 lists city before
    country. Encoded in topological order the block of the referencing table had seen the other
    one before it, the prompt puts it after: the P0 drifted as far as with every table alone.
    Groups are encoded in schema order, as the prompt lists them, so the P0 is the prefill's."""
    svc = service(loaded)
    prompt = prompts[db]
    layout = svc.layout(db, prompt)
    assert len(layout.groups) == 1 and list(layout.groups[0]) == prompt.schema.table_names
    svc.precompute(layout, runner)
    blocks = svc.load(svc.plan(layout, prompt.base_ids))
    state, _ = svc.assemble(blocks, runner, compute_tail=True)
    reference = runner.prefill(prompt.base_ids)
    assert state.ids == reference.ids
    assert max_diff(state, reference) < 1e-12
    assert torch.allclose(state.last_logits, reference.last_logits, atol=1e-12, rtol=0)


def test_tables_in_another_order_than_encoded_assemble_to_something_else(loaded, runner, prompts):
    """The method's own approximation: a prompt listing a group's tables in another order than
    the schema's (a client's `tables=`) gets blocks that saw other tables before them."""
    svc = service(loaded)
    schema = prompts["pets_1"].schema
    prompt = PromptBuilder(loaded.tokenizer, schema.subset(["Pets", "Has_Pet", "Student"]))
    layout = svc.layout("pets_1", prompts["pets_1"])
    svc.precompute(layout, runner)
    blocks = svc.load(svc.plan(layout, prompt.base_ids))
    assert [p.block.table for p in blocks.placed] == ["Pets", "Has_Pet", "Student"]
    state, _ = svc.assemble(blocks, runner, compute_tail=True)
    assert max_diff(state, runner.prefill(prompt.base_ids)) > 1e-3


@pytest.mark.parametrize("compute_tail", [True, False])
def test_a_missing_block_is_computed_in_place(loaded, runner, prompts, compute_tail):
    svc = service(loaded)
    prompt = prompts["concert_singer"]
    layout = svc.layout("concert_singer", prompt)
    svc.precompute(layout, runner)
    svc.store.delete(layout.scope.block_id("concert"))
    ids = prompt.prompt_ids(QUESTION)
    blocks = svc.load(svc.plan(layout, ids))
    assert blocks.missing == ["concert"] and [p.block.table for p in blocks.placed] == \
        ["stadium", "singer", "singer_in_concert"]
    state, stats = svc.assemble(blocks, runner, compute_tail=compute_tail)
    n_concert = len(layout.texts["concert"].ids)
    last_end = blocks.placed[-1].end
    assert state.ids == ids[:len(ids) if compute_tail else last_end]
    assert stats.num_computed_tokens == n_concert + (len(ids) - last_end if compute_tail else 0)
    assert stats.num_forwards == (2 if compute_tail else 1)
    assert (state.last_logits is not None) == compute_tail


def test_a_block_must_match_its_span(loaded, runner, prompts):
    svc = service(loaded)
    prompt = prompts["concert_singer"]
    layout = svc.layout("concert_singer", prompt)
    block = encode_group(runner, layout, 0)[0]
    with pytest.raises(AssemblyError, match="does not match"):
        assemble(runner, prompt.base_ids, [PlacedBlock(0, block)])
    start = len(layout.head_ids)
    with pytest.raises(AssemblyError, match="overlaps"):
        assemble(runner, prompt.base_ids, [PlacedBlock(start, block), PlacedBlock(start, block)])


@pytest.mark.parametrize("capacity,pinned_after_load,used_after", [(1 << 30, 4, 4), (0, 0, 0)])
def test_load_pins_then_release_unpins(loaded, runner, prompts, capacity, pinned_after_load, used_after):
    svc = service(loaded, capacity=capacity)
    prompt = prompts["concert_singer"]
    layout = svc.layout("concert_singer", prompt)
    svc.precompute(layout, runner)
    blocks = svc.load(svc.plan(layout, prompt.base_ids))
    assert len(blocks.pinned) == pinned_after_load and len(blocks.placed) == 4
    svc.release(blocks)
    svc.release(blocks)  # idempotent
    assert svc.tier.protected_bytes == 0 and svc.tier.num_blocks == used_after
    again = svc.load(svc.plan(layout, prompt.base_ids))
    stats = svc.stats()
    assert (stats["num_device_hits"], stats["num_store_hits"]) == ((4, 4) if capacity else (0, 8))
    assert stats["bytes_from_store"] == (1 if capacity else 2) * sum(p.block.num_bytes for p in again.placed)
    svc.release(again)
