"""P0 shared by the sessions that start from it (`engine/shared_prefix.py`):
never written, and a shared state behaves exactly like a private copy."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.model_runner import RowExtension
from headstart.engine.shared_prefix import SharedPrefixLayer


# (tokens kept by a crop, relative to the end of P0: negative crops into P0)
@pytest.mark.parametrize("keep_from_p0_end", [3, 0, -2])
@pytest.mark.parametrize("batched", [False, True])
def test_shared_state_equals_a_copy_and_leaves_p0_untouched(tiny_runtime, keep_from_p0_end, batched):
    runner = tiny_runtime.runner
    prompt = tiny_runtime.prompt_for("world_1")
    ids = prompt.prompt_ids("How many cities are in France?")
    p0 = runner.prefill(prompt.base_ids)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in p0.cache.layers]
    shared, copied = p0.share(), p0.copy()
    assert isinstance(shared.cache.layers[0], SharedPrefixLayer) and shared.nbytes() == 0
    assert shared.shared_nbytes() == p0.nbytes()
    for state in (shared, copied):
        runner.extend(state, ids[len(p0.ids):len(p0.ids) + 6])
        state.crop(len(p0.ids) + keep_from_p0_end)
    rest = ids[shared.num_tokens:]
    if batched:  # the packed runner reads the shared pieces in place
        other = p0.share()
        assert runner.extend_rows([RowExtension(shared, rest), RowExtension(other, ids[len(p0.ids):])]) == [True] * 2
        assert torch.allclose(other.last_logits, runner.prefill(ids).last_logits, atol=1e-10)
    else:
        runner.extend(shared, rest)
    runner.extend(copied, rest)
    assert shared.ids == copied.ids == ids
    for a, b in zip(shared.cache.layers, copied.cache.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-12) and torch.allclose(a.values, b.values, atol=1e-12)
    assert torch.allclose(shared.last_logits, copied.last_logits, atol=1e-10)
    private = (len(ids) - min(len(p0.ids), len(p0.ids) + keep_from_p0_end)) * tiny_runtime.loaded.kv_bytes_per_token()
    assert shared.nbytes() == private
    for layer, (keys, values) in zip(p0.cache.layers, before):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)  # P0 never written


def test_the_packed_runner_never_joins_p0_and_the_tail(tiny_runtime, monkeypatch):
    """The packed runner attends to P0 and the tail in place and appends to
    the tail only: no forward makes (and drops) a joined copy of a layer's
    P0 and tail, which cost a copy of the whole cache per layer, row and
    forward. The model's own attention (a lone `extend` without the runner)
    still joins them, as transformers' cache contract requires."""
    from headstart.engine import shared_prefix

    runner = tiny_runtime.runner
    prompt = tiny_runtime.prompt_for("world_1")
    ids = prompt.prompt_ids("How many cities are in France?")
    p0 = runner.prefill(prompt.base_ids)
    rows = [p0.share(), p0.share()]
    runner.extend(rows[0], ids[len(p0.ids):len(p0.ids) + 4])  # a private tail before the forward
    joins = []
    real = shared_prefix._joined
    monkeypatch.setattr(shared_prefix, "_joined", lambda *pieces: joins.append(1) or real(*pieces))
    assert runner.extend_rows([RowExtension(rows[0], ids[len(p0.ids) + 4:]),
                               RowExtension(rows[1], ids[len(p0.ids):])]) == [True] * 2
    assert joins == []
    monkeypatch.undo()
    assert rows[0].ids == rows[1].ids == ids
    assert torch.allclose(rows[0].last_logits, runner.prefill(ids).last_logits, atol=1e-10)
    assert torch.allclose(rows[1].last_logits, rows[0].last_logits, atol=1e-10)
