"""The fast path (HEADSTART_FAST_PATH): which kernels a model gets, that they
compute what the model's own forward computes, and that the product's
promise holds with them on: every anticipatory path generates the tokens of
a cold prefill run through the same kernels (float64 with the runner's
layers; float32 with oneDNN's packed matmuls)."""

from __future__ import annotations

import random

import pytest
import torch

from headstart.engine.runner.ops.onednn import onednn_supports
from headstart.engine.requests.generation import SamplingParams
from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row
from headstart.engine.runtime import EngineRuntime
from headstart.models.loader import load_model
from tests.kernel_skips import skip_unless_runs_here
from tests.typing_traces import KINDS, QUESTIONS

MAX_NEW = 8
PROMPT = list(range(1000, 1041))


@pytest.fixture(scope="module")
def tiny32():
    """random:tiny in float32 and its runner (the tests switch its kernels)."""
    return ModelRunner(load_model("random:tiny", "float32").model)


@pytest.mark.parametrize(("dtype", "mode", "expected"), [
    ("float32", "auto", "off"),  # random:tiny is below the size auto turns it on for
    ("float32", "off", "off"),
    ("float32", "onednn", "onednn"),
    ("bfloat16", "onednn", "onednn-bf16"),  # where oneDNN's bf16 path runs on this CPU, else off
    ("float64", "onednn", "off"),  # oneDNN has no float64 matmul: the model's own modules
])
def test_resolve_fast_path(dtype, mode, expected):
    model = load_model("random:tiny", dtype).model
    if expected == "onednn-bf16":  # AVX2-only CPUs (and HEADSTART_CPU_ISA=avx2) have no oneDNN bf16 kernels
        expected = "onednn" if onednn_supports(model) else "off"
    assert ModelRunner(model).resolve_choice(mode).kernels == expected


def test_unknown_fast_path_is_a_typed_error(tiny32):
    with pytest.raises(ValueError, match="valid: off, auto, onednn, native, inductor"):
        tiny32.set_fast_path("fastest")


@pytest.mark.parametrize("mode", ["off", "onednn", "native"])
def test_fast_path_computes_the_models_forward(tiny32, mode):
    """A prefill and a chunked extension through the runner's loop give the
    logits of the model's own (Hugging Face) forward, up to float32
    reassociation, and the lone extension really runs the installed ops."""
    skip_unless_runs_here(tiny32.model, mode)
    with torch.inference_mode():
        reference = tiny32.model(input_ids=torch.tensor([PROMPT])).logits[0, -1].float()
    assert tiny32.set_fast_path(mode) == mode and tiny32.fast_path == mode
    calls = []
    ops = tiny32.ops
    original = ops.head
    ops.head = lambda rows: calls.append(rows.shape[0]) or original(rows)
    try:
        whole = tiny32.prefill(PROMPT).last_logits
        chunked = KVState()
        for start, end in ((0, 20), (20, 21), (21, len(PROMPT))):
            assert tiny32.extend(chunked, PROMPT[start:end])
    finally:
        del ops.head
        tiny32.set_fast_path("off")
    assert calls == [1, 1, 1, 1]
    torch.testing.assert_close(whole, reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chunked.last_logits, reference, rtol=1e-4, atol=1e-4)


def test_fast_path_lone_extension_can_be_stopped(tiny32):
    """`should_abort` stops a lone extension between layers and leaves the state as it was."""
    tiny32.set_fast_path("onednn")
    try:
        state = tiny32.prefill(PROMPT[:10])
        before = (list(state.ids), state.last_logits.clone(), state.cache.num_tokens)
        assert not tiny32.extend(state, PROMPT[10:15], should_abort=lambda: True)
        assert (state.ids, state.cache.num_tokens) == (before[0], before[2])
        torch.testing.assert_close(state.last_logits, before[1], rtol=0, atol=0)
        assert tiny32.extend(state, PROMPT[10:15])
    finally:
        tiny32.set_fast_path("off")
    assert state.num_tokens == 15


def _greedy(runner: ModelRunner, state: KVState, n: int) -> list[int]:
    tokens = [int(state.last_logits.argmax())]
    for _ in range(n - 1):
        runner.extend(state, [tokens[-1]])
        tokens.append(int(state.last_logits.argmax()))
    return tokens


def test_batched_decode_rows_match_lone_rows_on_the_fast_path(tiny32):
    """Rows of different cache lengths decoding in one forward (continuous
    batching) pick the tokens each picks alone, with the same oneDNN kernels."""
    tiny32.set_fast_path("onednn")
    try:
        prompts = [PROMPT[:n] for n in (7, 19, 41)]
        lone = [_greedy(tiny32, tiny32.prefill(p), MAX_NEW) for p in prompts]
        states = [tiny32.prefill(p) for p in prompts]
        batched = [[int(s.last_logits.argmax())] for s in states]
        for _ in range(MAX_NEW - 1):
            assert all(tiny32.extend_rows([Row(s, [t[-1]]) for s, t in zip(states, batched)]))
            for s, t in zip(states, batched):
                t.append(int(s.last_logits.argmax()))
    finally:
        tiny32.set_fast_path("off")
    assert batched == lone


@pytest.fixture(scope="module", params=[("float64", "off"), ("float32", "onednn"), ("float32", "native")])
def fast_runtime(request, tmp_path_factory):
    dtype, mode = request.param
    skip_unless_runs_here(load_model("random:tiny", dtype).model, mode)
    runtime = EngineRuntime.from_settings(model="random:tiny", dtype=dtype, fast_path=mode,
                                          p0_cache_dir=tmp_path_factory.mktemp("p0"), chunk_tokens=64,
                                          debounce_ms=0.0)
    assert runtime.fast_path == mode
    yield runtime
    runtime.shutdown()


def test_sessions_match_cold_on_the_fast_path(fast_runtime):
    """Anticipatory sessions (every kind of edit, batched typing and decode
    rows) and a prefix request generate exactly the tokens of a cold prefill,
    every forward running the same fast path."""
    import threading

    params = SamplingParams(max_new_tokens=MAX_NEW)
    kinds = sorted(KINDS)
    results, errors = {}, []

    def typist(i: int) -> None:
        rng = random.Random(f"fast-{i}")
        snapshots = KINDS[kinds[i % len(kinds)]](QUESTIONS[i % len(QUESTIONS)], rng)
        session = fast_runtime.open_session("world_1", "headstart")
        try:
            for seq, text in enumerate(snapshots, 1):
                session.update(seq, text)
            session.wait_idle(60)
            results[i] = (snapshots[-1], session.submit(len(snapshots) + 1, snapshots[-1], params).result().token_ids)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            fast_runtime.close_session(session.session_id)

    threads = [threading.Thread(target=typist, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    question = QUESTIONS[0]
    results["prefix"] = (question, fast_runtime.complete("world_1", question, "prefix", MAX_NEW).token_ids)
    assert len(results) == 5
    for text, tokens in results.values():
        assert tokens == fast_runtime.complete("world_1", text, "cold", MAX_NEW).token_ids


def batched_vs_lone(runner: ModelRunner, new: tuple[int, ...] = (1, 3, 2)) -> tuple[list, list]:
    """Logits of rows (caches of 7, 19, 41 and 30 tokens, as many as `new`
    has counts; `new` tokens each) extended alone and in one batched forward."""
    prompts = [PROMPT[:n] for n in (7, 19, 41, 30)[:len(new)]]
    extra = [[500 + 7 * i + j for j in range(k)] for i, k in enumerate(new)]
    lone = []
    for p, e in zip(prompts, extra):
        state = runner.prefill(p)
        runner.extend(state, e)
        lone.append(state.last_logits)
    states = [runner.prefill(p) for p in prompts]
    assert all(runner.extend_rows([Row(s, e) for s, e in zip(states, extra)]))
    return lone, [s.last_logits for s in states]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["off", "onednn"])
@pytest.mark.parametrize("new", [(1, 3, 2), (1, 12, 3, 1)], ids=["typing", "with-a-prefill-chunk"])
def test_batch_invariant_rows_are_bit_identical_to_lone(dtype, mode, new):
    """HEADSTART_BATCH_INVARIANT: a batched row's logits equal its lone
    forward's bit for bit (a near-tie can no longer flip with batching),
    its attention included (PyTorch's fused attention on a slice of the
    packed queries, whatever its strides)."""
    model = load_model("random:tiny", dtype).model
    skip_unless_runs_here(model, mode)
    runner = ModelRunner(model)
    assert runner.set_fast_path(mode, batch_invariant=True) == mode
    lone, batched = batched_vs_lone(runner, new)
    for a, b in zip(lone, batched):
        assert torch.equal(a, b)


def test_batch_invariance_is_switched_with_the_kernels():
    runner = ModelRunner(load_model("random:tiny", "float32").model)
    assert runner.set_fast_path("off", batch_invariant=True) == "off" and runner.batch_invariant
    assert runner.set_fast_path("off") == "off" and not runner.batch_invariant


@pytest.mark.slow
def test_inductor_fast_path_computes_the_models_forward(tmp_path, monkeypatch):
    """The compiled blocks (one token, and 2..64 tokens with the axis dynamic)
    give the model's own logits, without recompiling per token count. A one-
    layer Qwen2 with a small vocabulary keeps the compile short."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import torch._dynamo.utils as dynamo_utils

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)
    runner = ModelRunner(Qwen2ForCausalLM(config).eval())
    prompt = [(37 * i) % 512 for i in range(30)]
    reference = runner.prefill(prompt).last_logits
    before = dynamo_utils.counters["stats"]["unique_graphs"]
    assert runner.set_fast_path("inductor", warm_rows=(1, 2)) == "inductor"
    try:
        graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        assert graphs - before == 6, "pre, post and head, each for one token and for 2..64"
        state = runner.prefill(prompt[:20])  # 20 tokens: the dynamic graphs
        runner.extend(state, prompt[20:23])  # 3 tokens: the same graphs
        for token in prompt[23:]:  # one token at a time: the one-token graphs
            runner.extend(state, [token])
        assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs, "no compile after engine start"
        torch.testing.assert_close(state.last_logits, reference, rtol=1e-4, atol=1e-4)
        lone, batched = batched_vs_lone_small(runner)
        assert [int(x.argmax()) for x in lone] == [int(x.argmax()) for x in batched]
    finally:
        runner.set_fast_path("off")


def batched_vs_lone_small(runner: ModelRunner):
    """`batched_vs_lone` with token ids inside a 512-token vocabulary."""
    prompts = [[(11 * i + r) % 512 for i in range(n)] for r, n in enumerate((5, 9, 17))]
    extra = [[(7 * r + j) % 512 for j in range(k)] for r, k in enumerate((1, 3, 2))]
    lone = []
    for p, e in zip(prompts, extra):
        state = runner.prefill(p)
        runner.extend(state, e)
        lone.append(state.last_logits)
    states = [runner.prefill(p) for p in prompts]
    assert all(runner.extend_rows([Row(s, e) for s, e in zip(states, extra)]))
    return lone, [s.last_logits for s in states]
