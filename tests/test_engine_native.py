"""The `native` fast path: headstart's own small-M linear kernel.

What is checked: the kernel computes x @ w.T (+ bias) for float32 and
bfloat16 weights against a float64 reference, every shape edge included
(K not a multiple of the 16-lane vector, N not a multiple of the 4-row
block, M across the 4-row input tiles); a token's result does not depend on
the other tokens in the call (bit for bit); bad input is a typed error; a
model on `native` computes its own forward, shares its weights with the
fused matrices (no second plain copy), decodes batched rows bit-identical
to lone ones, and anticipatory sessions generate a cold prefill's tokens;
a machine that cannot build the kernel falls back to oneDNN and says why.
"""

from __future__ import annotations

import pytest
import torch

from headstart.kernels import native as native_kernel
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row
from headstart.engine.runner.ops.native import NATIVE_MAX_TOKENS, native_supports
from headstart.models.loader import load_model
from tests.test_engine_fast_path import batched_vs_lone

REASON = native_kernel.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"native kernel unavailable here: {REASON}")

PROMPT = list(range(1000, 1041))


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 33), (64, 896), (13, 100), (130, 47)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_computes_the_linear_layer(weight_dtype, n, k, bias):
    kernel = native_kernel.load()
    gen = torch.Generator().manual_seed(n * 1000 + k)
    weight = torch.randn(n, k, generator=gen).to(weight_dtype)
    b = torch.randn(n, generator=gen) if bias else None
    for m in (1, 3, 4, 5, 8, 9, 17):  # 1 x M, 8 x 4 and (float32) 8 x 3 blocks, with remainders
        x = torch.randn(m, k, generator=gen)
        reference = x.double() @ weight.double().T + (b.double() if bias else 0)
        out = kernel.linear(x, weight, b)
        assert out.dtype == torch.float32 and out.shape == (m, n)
        torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5 * k ** 0.5)


def test_a_tokens_result_does_not_depend_on_the_others():
    """Row i of a call with M rows equals a call with row i alone, bit for bit,
    for every M and position in the 3- and 4-row tiles (one fixed summation
    order), float32's plain-load blocks included."""
    kernel = native_kernel.load()
    gen = torch.Generator().manual_seed(7)
    weight, bias = torch.randn(37, 211, generator=gen), torch.randn(37, generator=gen)
    x = torch.randn(20, 211, generator=gen)
    alone = [kernel.linear(x[i:i + 1].contiguous(), weight, bias) for i in range(20)]
    for m in (2, 4, 5, 8, 11, 17, 20):
        together = kernel.linear(x[:m].contiguous(), weight, bias)
        for i in range(m):
            assert torch.equal(together[i:i + 1], alone[i]), (m, i)


def _attend(kernel, q, pieces, scale):
    """One row's attention through the batch call (a row of one)."""
    return kernel.attend_batch(q, [(q.shape[0], pieces)], scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_of_one_token_over_cache_pieces(dtype):
    """One new token over a shared prefix read as a strided view (a crop of P0),
    a private tail and the token itself equals softmax(q k^T * scale) v computed
    in float64 over the joined cache, grouped-query heads included."""
    kernel = native_kernel.load()
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim = 14, 2, 64
    full_prefix = torch.randn(1, kv_heads, 40, dim, generator=gen).to(dtype)
    prefix_v = torch.randn(1, kv_heads, 40, dim, generator=gen).to(dtype)
    pieces = [(full_prefix[:, :, :33], prefix_v[:, :, :33]),  # views: kv heads 40 tokens apart
              (torch.randn(1, kv_heads, 5, dim, generator=gen).to(dtype),
               torch.randn(1, kv_heads, 5, dim, generator=gen).to(dtype)),
              (torch.randn(1, kv_heads, 1, dim, generator=gen).to(dtype),
               torch.randn(1, kv_heads, 1, dim, generator=gen).to(dtype))]
    q = torch.randn(1, heads, dim, generator=gen)
    scale = dim ** -0.5
    out = _attend(kernel, q, pieces, scale)[0]
    keys = torch.cat([k for k, _ in pieces], dim=2)[0].double()  # [kv_heads, L, dim]
    values = torch.cat([v for _, v in pieces], dim=2)[0].double()
    group = heads // kv_heads
    expected = torch.stack([torch.softmax(keys[h // group] @ q[0, h].double() * scale, dim=0) @ values[h // group]
                            for h in range(heads)])
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        _attend(kernel, q.double(), pieces, scale)
    with pytest.raises(ValueError):
        other = pieces[0][1].float() if dtype == torch.bfloat16 else pieces[0][1].bfloat16()
        _attend(kernel, q, [(pieces[0][0], other)], scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_attention_of_a_rows_new_tokens(dtype):
    """A typing row's few new tokens: token t sees the cache and the new tokens
    up to itself. Each token's output equals a call over the pieces cut after
    it, bit for bit (so a decode step's result does not depend on the call),
    and float64 causal attention to rounding."""
    kernel = native_kernel.load()
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, dim, nq = 14, 2, 64, 4
    prefix = torch.randn(1, kv_heads, 30, dim, generator=gen).to(dtype)
    prefix_v = torch.randn(1, kv_heads, 30, dim, generator=gen).to(dtype)
    new_k = torch.randn(1, kv_heads, 6, dim, generator=gen).to(dtype)  # a tail of 2, then the 4 new keys
    new_v = torch.randn(1, kv_heads, 6, dim, generator=gen).to(dtype)
    pieces = [(prefix[:, :, :25], prefix_v[:, :, :25]), (new_k, new_v)]
    q = torch.randn(nq, heads, dim, generator=gen)
    scale = dim ** -0.5
    out = _attend(kernel, q, pieces, scale)
    assert out.shape == (nq, heads, dim) and out.dtype == torch.float32
    keys = torch.cat([k for k, _ in pieces], dim=2)[0].double()
    values = torch.cat([v for _, v in pieces], dim=2)[0].double()
    group, total = heads // kv_heads, keys.shape[1]
    for t in range(nq):
        visible = total - (nq - 1 - t)
        cut = [pieces[0], (new_k[:, :, :visible - 25], new_v[:, :, :visible - 25])]
        assert torch.equal(out[t], _attend(kernel, q[t:t + 1].contiguous(), cut, scale)[0]), t
        expected = torch.stack([torch.softmax(keys[h // group, :visible] @ q[t, h].double() * scale, dim=0)
                                @ values[h // group, :visible] for h in range(heads)])
        torch.testing.assert_close(out[t].double(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="last piece must hold"):
        _attend(kernel, torch.randn(7, heads, dim), pieces, scale)


def test_bad_input_is_a_typed_error():
    kernel = native_kernel.load()
    weight = torch.randn(8, 16)
    with pytest.raises(ValueError, match="float32 contiguous"):
        kernel.linear(torch.randn(2, 16, dtype=torch.float64), weight)
    with pytest.raises(ValueError, match="float32 contiguous"):
        kernel.linear(torch.randn(2, 15), weight)
    with pytest.raises(ValueError, match="float32 contiguous"):
        kernel.linear(torch.randn(16, 2).T, weight)
    with pytest.raises(ValueError, match="bias"):
        kernel.linear(torch.randn(2, 16), weight, torch.randn(7))
    with pytest.raises(ValueError, match="float32 or bfloat16 weights"):
        kernel.linear(torch.randn(2, 16), weight.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_of_several_rows_in_one_call(dtype):
    """`attend_batch` (a batched forward's layer: decode steps and typing rows
    of different caches, one call): each row's output equals its own call
    bit for bit, whatever the other rows; bad rows are a typed error."""
    kernel = native_kernel.load()
    gen = torch.Generator().manual_seed(11)
    heads, kv_heads, dim = 14, 2, 64

    def piece(tokens):
        return (torch.randn(1, kv_heads, tokens, dim, generator=gen).to(dtype),
                torch.randn(1, kv_heads, tokens, dim, generator=gen).to(dtype))

    shared = piece(50)
    view = (shared[0][:, :, :37], shared[1][:, :, :37])  # a cropped P0, read as a strided view
    rows = [(1, [view, piece(6), piece(1)]), (3, [view, piece(3)]), (1, [piece(1)]), (8, [shared, piece(2), piece(8)])]
    q = torch.randn(sum(n for n, _ in rows), heads, dim, generator=gen)
    out = kernel.attend_batch(q, rows, dim ** -0.5)
    at = 0
    for n, pieces in rows:
        assert torch.equal(out[at:at + n], _attend(kernel, q[at:at + n].contiguous(), pieces, dim ** -0.5))
        at += n
    with pytest.raises(ValueError, match="must be q's"):
        kernel.attend_batch(q[:4].contiguous(), rows, dim ** -0.5)
    with pytest.raises(ValueError, match="last piece must hold"):
        kernel.attend_batch(q[:4].contiguous(), [(4, [piece(2)])], dim ** -0.5)
    with pytest.raises(ValueError, match="at least one cache piece per row"):
        kernel.attend_batch(q[:1].contiguous(), [(1, [])], dim ** -0.5)


def test_a_forward_of_decode_steps_and_a_prefill_chunk_is_bit_identical_to_lone_rows():
    """A packed forward whose rows take both attention paths (decode steps
    and a short typing row through the one native call, a 12-token chunk
    through matrix products): every row's logits equal its lone forward's,
    bit for bit, in float32 (every linear layer of up to NATIVE_MAX_TOKENS
    tokens is the kernel's)."""
    runner = ModelRunner(load_model("random:tiny", "float32").model)
    runner.set_fast_path("native")
    try:
        assert 1 + 12 + 3 + 1 <= NATIVE_MAX_TOKENS[torch.float32]
        lone, batched = batched_vs_lone(runner, (1, 12, 3, 1))
        for a, b in zip(lone, batched):
            assert torch.equal(a, b)
    finally:
        runner.set_fast_path("off")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_computes_the_models_forward_and_shares_its_weights(dtype):
    runner = ModelRunner(load_model("random:tiny", dtype).model)
    reference = runner.prefill(PROMPT)
    for token in (7, 8, 9):
        runner.extend(reference, [token])
    assert runner.set_fast_path("native") == "native"
    try:
        ops = runner.ops
        state = runner.prefill(PROMPT)  # 41 tokens: the kernel in float32, oneDNN in bfloat16 (NATIVE_MAX_TOKENS); then one-token steps: the kernel
        for token in (7, 8, 9):
            runner.extend(state, [token])
        tolerance = 1e-4 if dtype == "float32" else 0.15
        torch.testing.assert_close(state.last_logits.float(), reference.last_logits.float(),
                                   rtol=tolerance, atol=tolerance)
        # the model's projections are views of the fused matrices: one plain copy
        attn, mlp = runner.model.model.layers[0].self_attn, runner.model.model.layers[0].mlp
        fused = ops._qkv[0].weight
        assert attn.q_proj.weight.data_ptr() == fused.data_ptr()
        assert attn.k_proj.weight.data_ptr() == fused[attn.q_proj.out_features:].data_ptr()
        assert mlp.up_proj.weight.data_ptr() == ops._gate_up[0].weight[mlp.gate_proj.out_features:].data_ptr()
    finally:
        runner.set_fast_path("off")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_rows_are_bit_identical_to_lone_rows(dtype):
    """Without the batch-invariant setting: forwards of up to NATIVE_MAX_TOKENS
    tokens run the kernel, whose sums do not depend on the other rows, so a
    row's logits in a batch equal its lone forward's bit for bit (oneDNN's
    and MKL's do not promise this)."""
    runner = ModelRunner(load_model("random:tiny", dtype).model)
    runner.set_fast_path("native")
    try:
        lone, batched = batched_vs_lone(runner)  # 1 + 3 + 2 new tokens: one kernel forward
        assert 6 <= NATIVE_MAX_TOKENS[next(runner.model.parameters()).dtype]
        for a, b in zip(lone, batched):
            assert torch.equal(a, b)
        # and greedy decoding of 3 rows in one forward picks each row's lone tokens
        prompts = [PROMPT[:n] for n in (7, 19, 41)]
        rows = [runner.prefill(p) for p in prompts]
        alone = [runner.prefill(p) for p in prompts]
        for _ in range(6):
            tokens = [int(s.last_logits.argmax()) for s in rows]
            assert all(runner.extend_rows([Row(s, [t]) for s, t in zip(rows, tokens)]))
            for s, t in zip(alone, tokens):
                runner.extend(s, [t])
            for a, b in zip(alone, rows):
                assert torch.equal(a.last_logits, b.last_logits)
    finally:
        runner.set_fast_path("off")


def test_sessions_match_cold_on_native(tmp_path):
    """The product's promise on this path: an anticipatory session and a prefix
    request generate a cold prefill's tokens, every forward on `native`."""
    from headstart.engine.runtime import EngineRuntime
    from tests.engine_fixture import typed_then_submitted

    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float32", fast_path="native",
                                          p0_cache_dir=tmp_path, chunk_tokens=64, debounce_ms=0.0)
    try:
        assert runtime.fast_path == "native"
        question = "Which countries in Europe have more than ten million people?"
        anticipated = typed_then_submitted(runtime, "world_1", question, 3, 8)
        cold = runtime.complete("world_1", question, "cold", 8).token_ids
        assert anticipated == cold
        assert runtime.complete("world_1", question, "prefix", 8).token_ids == cold
    finally:
        runtime.shutdown()


def test_float64_cannot_run_native():
    model = load_model("random:tiny", "float64").model
    assert native_supports(model) is not None
    choice = ModelRunner(model).resolve_choice("native")
    assert choice.kernels == "off" and "float32 and bfloat16" in choice.reason


def test_a_kernel_that_cannot_build_falls_back_to_onednn(monkeypatch, tmp_path):
    """No compiler (or a failed build): `native` resolves to oneDNN with the
    reason kept on the choice; the build error names the command."""
    monkeypatch.setenv("HEADSTART_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setattr(native_kernel, "_loaded", {})
    monkeypatch.setattr(native_kernel, "_failures", {})
    with pytest.raises(native_kernel.NativeKernelUnavailable, match="building native.cpp failed"):
        native_kernel.load()
    assert not list(tmp_path.glob("kernels/*/*.so*")), "a failed build leaves no library behind"
    runner = ModelRunner(load_model("random:tiny", "float32").model)
    assert runner.set_fast_path("native") == "onednn"
    assert "building native.cpp failed" in runner.choice.reason
    runner.set_fast_path("off")


def test_the_build_is_cached_by_source_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADSTART_HOME", str(tmp_path))
    monkeypatch.setattr(native_kernel, "_loaded", {})
    first = native_kernel.load()
    built = list(tmp_path.glob("kernels/*/native-*.so"))
    assert built == [first.path]
    mtime = first.path.stat().st_mtime_ns
    monkeypatch.setattr(native_kernel, "_loaded", {})
    second = native_kernel.load()  # found, not rebuilt
    assert second.path == first.path and first.path.stat().st_mtime_ns == mtime


def test_an_avx2_restriction_turns_native_off(monkeypatch):
    """HEADSTART_CPU_ISA=avx2 on an AVX-512 machine: no native kernel (an AVX2 CPU has none),
    and a float32 model's `native` resolves to oneDNN with that reason."""
    monkeypatch.setenv("HEADSTART_CPU_ISA", "avx2")
    assert "needs AVX-512" in native_kernel.unavailable_reason()
    runner = ModelRunner(load_model("random:tiny", "float32").model)
    assert runner.set_fast_path("native") == "onednn"
    assert "needs AVX-512" in runner.choice.reason
    runner.set_fast_path("off")
