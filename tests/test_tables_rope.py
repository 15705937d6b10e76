"""Rotary re-application is exact: a block placed at its original position gives back
the keys of a normal forward bit for bit. Moved elsewhere, layer 0 (whose pre-RoPE keys
depend on the token alone) matches a forward at the new position up to the rounding of
the key projection's matmul, which depends on how many rows it multiplies."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.runner.model_runner import ModelRunner
from headstart.models import load_model
from headstart.tables.rope import RopeError, apply_rope, rotary_cos_sin

IDS = [791, 1855, 5391, 18021, 320, 198, 220, 13, 3555, 2082, 11, 21543, 1467, 4236]


@pytest.fixture(scope="module", params=["float64", "float32"])
def loaded(request):
    return load_model("random:tiny", request.param)


def forward_keys(model, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(pre-RoPE keys captured, post-RoPE keys in the cache), per layer `# [kv_heads, tokens, head_dim]`."""
    encoded = ModelRunner(model).encode_rows([ids])
    return [k[0] for k in encoded.keys_pre_rope], [k[0] for k in encoded.keys]


@pytest.mark.parametrize("start,length", [(0, 14), (3, 5), (9, 5), (13, 1)])
def test_block_at_its_original_position_reproduces_forward_keys_bit_for_bit(loaded, start, length):
    pre, post = forward_keys(loaded.model, IDS)
    block = torch.stack([k[:, start:start + length] for k in pre])  # [layers, kv_heads, length, head_dim]
    placed = apply_rope(loaded.model, block, start)
    for layer, keys in enumerate(post):
        assert torch.equal(placed[layer], keys[:, start:start + length])


@pytest.mark.parametrize("old_start,new_start", [(0, 7), (5, 0), (2, 1000)])
def test_layer0_block_moved_to_a_new_position_matches_a_forward_there(loaded, old_start, new_start):
    table = IDS[6:11]
    filler = IDS[:3] * 400
    _, post_new = forward_keys(loaded.model, filler[:new_start] + table)
    pre_old, _ = forward_keys(loaded.model, filler[:old_start] + table)
    block = pre_old[0][:, old_start:old_start + len(table)].unsqueeze(0)  # layer 0 only
    placed = apply_rope(loaded.model, block, new_start)
    tol = 1e-12 if loaded.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(placed[0], post_new[0][:, new_start:new_start + len(table)], rtol=tol, atol=tol)
    assert not torch.allclose(placed[0], block[0], atol=1e-3)  # it was rotated


def test_cos_sin_do_not_depend_on_the_window(loaded):
    model, dtype = loaded.model, loaded.dtype
    cos_all, sin_all = rotary_cos_sin(model, 0, 64, dtype, torch.device("cpu"))
    cos, sin = rotary_cos_sin(model, 40, 8, dtype, torch.device("cpu"))
    assert cos.dtype == dtype
    assert torch.equal(cos[0], cos_all[0, 40:48]) and torch.equal(sin[0], sin_all[0, 40:48])


def test_unknown_model_layout_is_a_typed_error():
    with pytest.raises(RopeError, match="rotary_emb"):
        apply_rope(torch.nn.Linear(2, 2), torch.zeros(1, 1, 1, 2), 0)
