"""The screened LM head (`engine/runner/ops/screened_head.py`): the float32 head's argmax
from an int8 screen and an exact recompute of the rows that could win.

What is checked: against the full float32 head (the same kernel), the argmax
is the same and every candidate's logit is the same bits, for random hidden
states and for near-ties built on purpose (a row duplicated, a row one ulp
off another, hidden states pointing at a pair); every other logit is within
its bound; a row's result does not depend on the other rows of the call;
heads with a bias, non-finite hidden states and forwards above the kernel's
token count run the full head; a model on `native` with its head screened
decodes the same tokens and logits argmax as with the full head, and
anticipatory sessions still generate a cold prefill's tokens.
"""

from __future__ import annotations

import pytest
import torch

from headstart.kernels import native as native_kernel
from headstart.engine.runner.ops import screened_head
from headstart.engine.runner.ops.onednn import PackedLinear
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.ops.native import NativeLinear, NativeOps
from headstart.engine.runner.ops.screened_head import ScreenedHead, screens
from headstart.models.loader import load_model

REASON = native_kernel.unavailable_reason()
if REASON is None and not native_kernel.load().screen_available:
    REASON = "the CPU has no AVX512-VNNI for the screening pass"
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"native kernel unavailable here: {REASON}")

VOCAB, HIDDEN = 6000, 96


def _heads(weight: torch.Tensor) -> tuple[NativeLinear, ScreenedHead]:
    kernel = native_kernel.load()
    full = NativeLinear(kernel, weight, PackedLinear([weight], [None]), max_tokens=48)
    return full, ScreenedHead(full)


def _weight_with_ties() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN, generator=g) * 0.05
    weight[11] = weight[5]  # an exact tie: the argmax is the first index
    weight[23] = weight[17]
    weight[23, 3] = torch.nextafter(weight[17, 3], torch.tensor(1.0))  # one ulp apart
    weight[40] = weight[30] * (1 + 2.0 ** -12)  # equal in bfloat16, not in float32
    # rounding to int8 flips these two (both rows' scale is u = 2 / 127): in
    # float32 row 50 wins (127 + 95.45 + 0.45 = 222.9 u against 127 + 95.55
    # - 0.4 = 222.15 u), in int8 row 60 (127 + 96 = 223 u against 222 u)
    u = 2.0 / 127
    weight[50, :3] = torch.tensor([127 * u, 95.45 * u, 0.45 * u])
    weight[60, :3] = torch.tensor([127 * u, 95.55 * u, -0.4 * u])
    return weight.contiguous()


def _hidden(weight: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(HIDDEN, generator=g) * 3 for _ in range(n)]
    rows += [weight[i] * 40 + torch.randn(HIDDEN, generator=g) * 1e-3 for i in (5, 17, 30)]  # pointing at a pair
    return torch.stack(rows).contiguous()


def test_the_argmax_and_every_candidate_are_the_full_heads_bits():
    weight = _weight_with_ties()
    full, head = _heads(weight)
    for h in _hidden(weight, 40, seed=1):
        h = h[None]
        exact, screened = full(h)[0], head(h)[0]
        assert int(screened.argmax()) == int(exact.argmax())
        # every row at the top (ties included) was recomputed: the same bits
        top = (exact == exact.max()).nonzero().flatten()
        assert torch.equal(screened[top], exact[top])
        # the others within their bound
        slack = head.slack(h)[0]
        assert bool(((screened.double() - exact.double()).abs() <= slack).all())
    # the pair rounding flips: the screen alone would pick row 60
    h = torch.zeros(1, HIDDEN)
    h[0, :3] = 40.0
    estimate = full.kernel.screen_u8i8((h / (40 / 127)).round().add(128).to(torch.uint8), torch.tensor([40 / 127]),
                                       head.quantized, head.qsum, head.scale)
    assert int(full(h).argmax()) == 50 and int(estimate.argmax()) == 60
    assert int(head(h).argmax()) == 50
    # the planted ties resolve as the full head resolves them
    for i, expected in ((5, 5), (17, None), (30, None)):
        h = (weight[i] * 40)[None]
        assert int(head(h).argmax()) == int(full(h).argmax())
        if expected is not None:
            assert int(full(h).argmax()) == expected


def test_a_rows_logits_do_not_depend_on_the_other_rows():
    weight = _weight_with_ties()
    full, head = _heads(weight)
    hidden = _hidden(weight, 1, seed=2)  # 4 rows
    together = head(hidden)
    for r in range(hidden.shape[0]):
        assert torch.equal(together[r], head(hidden[r:r + 1])[0])
        assert int(together[r].argmax()) == int(full(hidden[r:r + 1])[0].argmax())


def test_what_is_not_screened():
    weight = _weight_with_ties()
    full, head = _heads(weight)
    many = _hidden(weight, screened_head.SCREEN_MAX_ROWS - 2, seed=3)  # one row above SCREEN_MAX_ROWS: the full head
    calls = head.calls
    assert torch.equal(head(many), full(many)) and head.calls == calls
    bad = torch.full((1, HIDDEN), float("nan"))
    calls = head.calls
    assert bool(head(bad).isnan().all()) and head.calls == calls  # not finite: the full head
    kernel = full.kernel
    assert not screens(weight, torch.zeros(VOCAB), kernel, min_bytes=0)  # a bias: not screened
    assert not screens(weight.to(torch.bfloat16), None, kernel, min_bytes=0)
    assert not screens(weight, None, kernel)  # 2.3 MB: below SCREEN_MIN_BYTES
    assert screens(weight, None, kernel, min_bytes=0)
    assert not screens(weight, None, object(), min_bytes=0)  # a kernel without the screening pass
    with pytest.raises(ValueError):
        ScreenedHead(NativeLinear(full.kernel, weight.to(torch.bfloat16), full.packed, 48))
    # a screen that cannot tell the rows apart (all equal): the full head
    same = weight[:1].expand(VOCAB, HIDDEN).contiguous()
    flat_full, flat_head = _heads(same)
    h = torch.randn(1, HIDDEN)
    assert torch.equal(flat_head(h), flat_full(h)) and flat_head.calls == 0
    # the kernel's entry points: bad input is a typed error
    xu = torch.full((1, HIDDEN), 128, dtype=torch.uint8)
    with pytest.raises(ValueError):
        kernel.screen_u8i8(xu.to(torch.int8), torch.ones(1), head.quantized, head.qsum, head.scale)
    with pytest.raises(ValueError):
        kernel.screen_u8i8(xu, torch.ones(1), head.quantized, head.qsum.long(), head.scale)
    with pytest.raises(ValueError):
        kernel.screen_select(torch.zeros(VOCAB), head.a.float(), head.b, 1.0, 0.0, 10)
    assert kernel.screen_select(torch.zeros(VOCAB), head.a, head.b, 1.0, 0.0, 10) is None  # all tie: over the cap


def test_a_model_with_its_head_screened_decodes_the_full_heads_tokens(monkeypatch):
    runner = ModelRunner(load_model("random:tiny", "float32").model)
    prompt = list(range(1000, 1030))
    runs = {}
    for screen in (False, True):
        runner.set_fast_path("off")
        monkeypatch.setattr(screened_head, "SCREEN_MIN_BYTES", 0 if screen else 1 << 62)
        assert runner.set_fast_path("native") == "native"
        assert isinstance(runner.ops._head, ScreenedHead) == screen
        state, tokens, tops = runner.prefill(prompt), [], []
        for _ in range(12):
            token = int(state.last_logits.argmax())
            tokens.append(token)
            tops.append(state.last_logits[token])
            runner.extend(state, [token])
        runs[screen] = tokens, torch.stack(tops)
    runner.set_fast_path("off")
    assert runs[True][0] == runs[False][0]
    assert torch.equal(runs[True][1], runs[False][1])  # the chosen tokens' logits: the same bits
    assert runner.fast_path == "off"


def test_native_ops_screen_the_head_by_size_or_when_asked():
    model = load_model("random:tiny", "float32").model
    assert not isinstance(NativeOps(model)._head, ScreenedHead)  # 19 MB: below the default size
    assert isinstance(NativeOps(model, screen_head=True)._head, ScreenedHead)
    assert not isinstance(NativeOps(model, screen_head=False)._head, ScreenedHead)


def test_sessions_match_cold_with_the_head_screened(tmp_path, monkeypatch):
    from headstart.engine.runtime import EngineRuntime
    from tests.engine_fixture import typed_then_submitted

    monkeypatch.setattr(screened_head, "SCREEN_MIN_BYTES", 0)
    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float32", fast_path="native",
                                          p0_cache_dir=tmp_path, chunk_tokens=64, debounce_ms=0.0)
    try:
        assert isinstance(runtime.runner.ops._head, ScreenedHead)
        question = "How many singers are older than thirty?"
        anticipated = typed_then_submitted(runtime, "concert_singer", question, 4, 8)
        cold = runtime.complete("concert_singer", question, "cold", 8).token_ids
        assert anticipated == cold
        assert runtime.runner.ops._head.calls > 0
    finally:
        runtime.shutdown()
