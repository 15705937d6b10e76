"""Table blocks through the model runner are the bits the padded forward of
`tables.precompute` gave before the runner owned it (main at 6481820): the
reference below is that forward, kept here only to compare against, run on
random:tiny in float64 and float32, one group per forward and several
right-padded in one, and whatever kernels the runner has installed (a block
is keyed by model and dtype, not by kernels)."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.model_runner import ModelRunner
from headstart.models import load_model
from headstart.prompt import PromptBuilder
from headstart.schema.resolve import resolve_database
from headstart.tables.layout import TableLayout
from headstart.tables.precompute import _batches, encode_groups

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


@pytest.mark.parametrize("mode", ["pfk", "independent"])
@pytest.mark.parametrize("fast_path", ["off", "eager"])
def test_runner_blocks_are_the_padded_forwards_bits(loaded, mode, fast_path):
    """Every block of three databases, batched as `iter_precompute` batches
    them (independent: several groups right-padded in one forward), equals the
    reference bit for bit, with no kernels installed and with the runner's own
    layers installed for its other forwards."""
    runner = ModelRunner(loaded.model, fast_path=fast_path)
    assert runner.fast_path == fast_path
    num_blocks = num_tables = num_batched = 0
    for db in DBS:
        prompt = PromptBuilder(loaded.tokenizer, resolve_database(db).schema)
        layout = TableLayout.build(prompt, model_id=loaded.model_id, dtype=loaded.dtype_name, mode=mode)
        num_tables += len(layout.texts)
        for batch in _batches(layout, list(range(len(layout.groups))), 2048):
            expected = reference_blocks(loaded.model, layout, batch)
            num_batched += len(batch) > 1
            for blocks in encode_groups(runner, layout, batch).values():
                for block in blocks:
                    keys, values = expected[block.table]
                    assert block.keys_pre_rope.dtype == loaded.dtype
                    assert torch.equal(block.keys_pre_rope, keys), (db, block.table)
                    assert torch.equal(block.values, values), (db, block.table)
                    num_blocks += 1
    assert num_blocks == num_tables
    if mode == "independent":
        assert num_batched > 0  # several groups shared a padded forward


def test_encode_rows_returns_each_rows_keys_before_and_after_rope(loaded):
    """The keys after RoPE are the cache's, those before re-rotate to them
    (`tables.rope`); a shorter row's positions past its end are padding."""
    from headstart.tables.rope import apply_rope

    rows = [[791, 1855, 5391, 18021, 320, 198], [220, 13, 3555]]
    encoded = ModelRunner(loaded.model).encode_rows(rows)
    num_layers = len(loaded.model.model.layers)
    assert len(encoded.keys_pre_rope) == len(encoded.keys) == len(encoded.values) == num_layers
    assert encoded.keys[0].shape[:1] + encoded.keys[0].shape[2:3] == (2, 6)
    for row, ids in enumerate(rows):
        pre = torch.stack([k[row, :, :len(ids)] for k in encoded.keys_pre_rope])
        placed = apply_rope(loaded.model, pre, 0)
        for layer in range(num_layers):
            assert torch.equal(placed[layer], encoded.keys[layer][row, :, :len(ids)])
