"""The model runner owns a model's kernels: nothing of the engine is stored on the
Hugging Face model object, and two runners of one model run their own kernels."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.runner.model_runner import ModelRunner, UnsupportedModel
from headstart.engine.runtime import EngineRuntime
from headstart.models.loader import load_model
from tests.engine_fixture import typed_then_submitted
from tests.kernel_skips import skip_unless_runs_here

PROMPT = list(range(1000, 1041))


def _headstart_attributes(model) -> list[str]:
    """Every `_headstart*` attribute on the model or any of its modules."""
    return [f"{name or 'model'}.{key}" for name, module in model.named_modules()
            for key in vars(module) if key.startswith("_headstart")]


@pytest.mark.parametrize(("dtype", "fast_path"), [("float64", "auto"), ("float32", "onednn")])
def test_a_runtime_leaves_no_attribute_on_the_model(tmp_path, dtype, fast_path):
    """A runtime built and used (a typing session, whose extensions can be
    stopped between layers, and cold and prefix completions) sets no
    `_headstart_` attribute on the model: its runner holds the kernels."""
    runtime = EngineRuntime.from_settings(model="random:tiny", dtype=dtype, fast_path=fast_path,
                                          p0_cache_dir=tmp_path, chunk_tokens=64, debounce_ms=0.0)
    try:
        question = "How many countries are there?"
        anticipated = typed_then_submitted(runtime, "world_1", question, 4, 4)
        assert anticipated == runtime.complete("world_1", question, "cold", 4).token_ids
        runtime.complete("world_1", question, "prefix", 4)
        assert runtime.runner.model is runtime.model
        assert runtime.fast_path == runtime.runner.fast_path
    finally:
        runtime.shutdown()
    assert not _headstart_attributes(runtime.model)


def test_two_runners_of_one_model_run_their_own_kernels():
    """The kernels are the runner's, not the model's: a runner with oneDNN
    installed leaves another runner of the same model on its own modules."""
    model = load_model("random:tiny", "float32").model
    skip_unless_runs_here(model, "onednn")
    plain, fast = ModelRunner(model), ModelRunner(model, fast_path="onednn")
    assert (plain.fast_path, fast.fast_path) == ("off", "onednn") and plain.ops is not fast.ops
    heads = []
    original = fast.ops.head
    fast.ops.head = lambda rows: heads.append(rows.shape[0]) or original(rows)
    try:
        reference = plain.prefill(PROMPT)
        assert heads == []  # the model's own modules: not the other runner's ops
        state = fast.prefill(PROMPT)
        assert heads == [1]
    finally:
        del fast.ops.head
    torch.testing.assert_close(state.last_logits, reference.last_logits, rtol=1e-4, atol=1e-4)
    assert not _headstart_attributes(model)


@pytest.mark.parametrize("stop_before_layer", [0, 1])
def test_a_stopped_lone_extension_leaves_the_state_as_it_was(stop_before_layer):
    """A lone extension stops between decoder layers (before the first, or
    after one has run) when its `should_abort` asks: the state is untouched,
    no hook is left on the model, and the same extension then runs whole."""
    runner = ModelRunner(load_model("random:tiny", "float64").model)
    state = runner.prefill(PROMPT[:10])
    before = (list(state.ids), state.last_logits.clone(), state.cache.num_tokens)
    polls = []

    def abort() -> bool:
        polls.append(1)
        return len(polls) > stop_before_layer

    assert not runner.extend(state, PROMPT[10:15], should_abort=abort)
    assert len(polls) == stop_before_layer + 1
    assert (state.ids, state.cache.num_tokens) == (before[0], before[2])
    assert torch.equal(state.last_logits, before[1])
    assert runner.extend(state, PROMPT[10:15], should_abort=lambda: False)
    assert state.ids == PROMPT[:15] and state.cache.num_tokens == 15
    torch.testing.assert_close(state.last_logits, runner.prefill(PROMPT[:15]).last_logits, rtol=1e-10, atol=1e-10)
    assert not any(layer._forward_pre_hooks for layer in runner.model.model.layers)
    assert not _headstart_attributes(runner.model)


def test_a_model_the_runner_cannot_run_is_refused_with_the_reason():
    model = load_model("random:tiny", "float64").model
    model.config.use_sliding_window = True
    with pytest.raises(UnsupportedModel, match="sliding-window"):
        ModelRunner(model)
    model.config.use_sliding_window, model.config.model_type = False, "gpt2"
    with pytest.raises(UnsupportedModel, match="'gpt2'"):
        ModelRunner(model)


def test_an_unknown_fast_path_is_a_typed_error():
    with pytest.raises(ValueError, match="valid: off, auto"):
        ModelRunner(load_model("random:tiny", "float64").model, fast_path="fastest")
