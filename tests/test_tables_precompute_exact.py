"""Table blocks come from the runner's one decoder loop (`ModelRunner.encode_rows`):
each block is the bits of a lone cold prefill of its group's sequence through
that loop with the model's own modules, whether it shared its forward with
other groups or not and whatever kernels the runner has installed (a block is
keyed by model and dtype, not by kernels); and it is the padded Hugging Face
forward's block (how `tables.precompute` encoded before the runner owned it,
main at 6481820, kept below only to compare against) up to rounding. Run on
random:tiny in float64 and float32."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.runner.model_runner import ModelRunner
from headstart.models import load_model
from headstart.prompt import PromptBuilder
from headstart.schema.resolve import resolve_database
from headstart.tables.layout import TableLayout
from headstart.tables.precompute import _batches, encode_groups
from tests.kernel_skips import skip_unless_runs_here

DBS = ("concert_singer", "pets_1", "car_1")


@pytest.fixture(scope="module", params=["float64", "float32"])
def loaded(request):
    return load_model("random:tiny", request.param)


@torch.inference_mode()
def reference_blocks(model, layout: TableLayout, group_indices: list[int]) -> dict[str, tuple]:
    """{table: (keys before RoPE, values)} as `encode_groups` computed them
    before the runner: one padded Hugging Face forward, keys caught by hooks
    on the key projections. # each [layers, kv_heads, n, head_dim]"""
    seqs = [layout.group_sequence(layout.groups[g]) for g in group_indices]
    width = max(len(ids) for ids, _ in seqs)
    input_ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, (ids, _) in enumerate(seqs):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        mask[row, :len(ids)] = 1
    layers = model.model.layers
    keys: list[torch.Tensor | None] = [None] * len(layers)

    def hook(i, head_dim):
        def capture(_module, _inputs, output):
            keys[i] = output.detach().view(output.shape[0], output.shape[1], -1, head_dim).transpose(1, 2)
        return capture

    handles = [layer.self_attn.k_proj.register_forward_hook(hook(i, layer.self_attn.head_dim))
               for i, layer in enumerate(layers)]
    try:
        out = model(input_ids=input_ids, attention_mask=mask if len(seqs) > 1 else None, use_cache=True,
                    logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
    values = [layer.values for layer in out.past_key_values.layers]
    blocks = {}
    for row, (g, (_, offsets)) in enumerate(zip(group_indices, seqs)):
        for name in layout.groups[g]:
            start, n = offsets[name], len(layout.texts[name].ids)
            blocks[name] = (torch.stack([k[row, :, start:start + n] for k in keys]),
                            torch.stack([v[row, :, start:start + n] for v in values]))
    return blocks


def lone_prefill_blocks(loaded, layout: TableLayout, group_index: int) -> dict[str, tuple]:
    """{table: (keys after RoPE, values)} as a lone cold prefill of the group's
    sequence through the runner's loop with the model's own modules caches
    them. # each [layers, kv_heads, n, head_dim]"""
    ids, offsets = layout.group_sequence(layout.groups[group_index])
    state = ModelRunner(loaded.model, fast_path="off").prefill(ids)
    layers = state.cache.layers
    return {name: (torch.stack([layer.keys[0, :, offsets[name]:offsets[name] + len(layout.texts[name].ids)]
                                for layer in layers]),
                   torch.stack([layer.values[0, :, offsets[name]:offsets[name] + len(layout.texts[name].ids)]
                                for layer in layers]))
            for name in layout.groups[group_index]}


@pytest.mark.parametrize("mode", ["pfk", "independent"])
@pytest.mark.parametrize("fast_path", ["off", "onednn"])
def test_runner_blocks_are_a_lone_cold_prefills_bits(loaded, mode, fast_path):
    """Every block of three databases, batched as `iter_precompute` batches
    them (independent: several groups in one forward): its values are those a
    lone cold prefill of its group caches, bit for bit, and its keys before
    RoPE rotate (`tables.rope.apply_rope`, at the block's offset) into that
    prefill's keys, bit for bit; with the model's own modules installed for
    the runner's other forwards and with oneDNN's (where they run here)."""
    from headstart.tables.rope import apply_rope

    skip_unless_runs_here(loaded.model, fast_path)
    runner = ModelRunner(loaded.model, fast_path=fast_path)
    if runner.fast_path != fast_path:
        pytest.skip(f"{fast_path} does not run {loaded.dtype_name} here: {runner.choice.reason}")
    num_blocks = num_tables = num_batched = 0
    for db in DBS:
        prompt = PromptBuilder(loaded.tokenizer, resolve_database(db).schema)
        layout = TableLayout.build(prompt, model_id=loaded.model_id, dtype=loaded.dtype_name, mode=mode)
        num_tables += len(layout.texts)
        for batch in _batches(layout, list(range(len(layout.groups))), 2048):
            num_batched += len(batch) > 1
            for g, blocks in encode_groups(runner, layout, batch).items():
                expected = lone_prefill_blocks(loaded, layout, g)
                for block in blocks:
                    keys, values = expected[block.table]
                    assert block.keys_pre_rope.dtype == loaded.dtype
                    assert torch.equal(block.values, values), (db, block.table)
                    assert torch.equal(apply_rope(loaded.model, block.keys_pre_rope, block.position_offset), keys), (
                        db, block.table)
                    num_blocks += 1
    assert num_blocks == num_tables
    if mode == "independent":
        assert num_batched > 0  # several groups shared a forward


def test_runner_blocks_are_the_padded_forwards_up_to_rounding(loaded):
    """Moving precompute onto the runner's loop changed only the rounding: every
    block equals the padded Hugging Face forward's (several groups right-padded
    in one forward) to float64's 1e-10, float32's 1e-4."""
    runner = ModelRunner(loaded.model)
    tol = 1e-10 if loaded.dtype == torch.float64 else 1e-4
    num_blocks = 0
    for db in DBS:
        prompt = PromptBuilder(loaded.tokenizer, resolve_database(db).schema)
        layout = TableLayout.build(prompt, model_id=loaded.model_id, dtype=loaded.dtype_name, mode="independent")
        for batch in _batches(layout, list(range(len(layout.groups))), 2048):
            expected = reference_blocks(loaded.model, layout, batch)
            for blocks in encode_groups(runner, layout, batch).values():
                for block in blocks:
                    keys, values = expected[block.table]
                    torch.testing.assert_close(block.keys_pre_rope, keys, rtol=tol, atol=tol)
                    torch.testing.assert_close(block.values, values, rtol=tol, atol=tol)
                    num_blocks += 1
    assert num_blocks > 0


def test_encode_rows_returns_each_rows_keys_before_and_after_rope(loaded):
    """Each row's keys after RoPE are the cache's, those before re-rotate to
    them (`tables.rope`), every entry is its row's own length (no padding),
    and a row's bits do not depend on the rows beside it."""
    from headstart.tables.rope import apply_rope

    rows = [[791, 1855, 5391, 18021, 320, 198], [220, 13, 3555]]
    runner = ModelRunner(loaded.model)
    encoded = runner.encode_rows(rows)
    num_layers = len(loaded.model.model.layers)
    assert len(encoded.keys_pre_rope) == len(encoded.keys) == len(encoded.values) == num_layers
    assert [k.shape[1] for k in encoded.keys[0]] == [6, 3]
    for row, ids in enumerate(rows):
        alone = runner.encode_rows([ids])
        pre = torch.stack([k[row] for k in encoded.keys_pre_rope])
        placed = apply_rope(loaded.model, pre, 0)
        for layer in range(num_layers):
            assert torch.equal(placed[layer], encoded.keys[layer][row])
            assert torch.equal(encoded.keys_pre_rope[layer][row], alone.keys_pre_rope[layer][0])
            assert torch.equal(encoded.values[layer][row], alone.values[layer][0])


def test_encoding_leaves_no_cache_and_no_hook(loaded):
    """Precompute takes no block of the pool and leaves no hook on the model."""
    import gc

    from headstart.engine.kv.block_pool import pools

    model = loaded.model
    gc.collect()
    before = sum(pool.stats().used_blocks for pool in pools())
    encoded = ModelRunner(model).encode_rows([[791, 1855, 5391], [220, 13]])
    assert sum(pool.stats().used_blocks for pool in pools()) == before
    assert encoded.keys[0][0].shape[1] == 3
    assert not any(layer.self_attn.k_proj._forward_hooks or layer._forward_pre_hooks for layer in model.model.layers)
