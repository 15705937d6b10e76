"""Decoding options beyond greedy (`headstart.engine.requests.sampling`): stop strings,
ignore_eos, min_new_tokens, penalties, top-k, seeds; checked on the real
engine (random:tiny, float64) against the plain greedy answer, and the
`Sampler` / `StopText` units against hand-made logits."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.errors import InvalidInput
from headstart.engine.requests.sampling import Sampler, SamplingParams, StopText, token_logprobs
from services.engine.detok import TextDeltas

QUESTION = "How many singers are there?"
DB = "concert_singer"


def _complete(runtime, **params):
    return runtime.start_complete(DB, QUESTION, "prefix", SamplingParams(**params)).result(60)


@pytest.fixture(scope="module")
def greedy(tiny_runtime):
    """The plain greedy answer (random weights: it never ends early, 24 tokens)."""
    return _complete(tiny_runtime, max_new_tokens=24)


def test_stop_string_cuts_the_text_before_it(tiny_runtime, greedy):
    text = greedy.text
    # a stop string from the middle of the greedy text: the answer ends right before it
    cut = len(text) // 2
    stop = text[cut:cut + 3]
    first = text.find(stop)
    result = _complete(tiny_runtime, max_new_tokens=24, stop=(stop, "never-there"))
    assert result.finish_reason == "stop"
    assert result.text == text[:first] and stop not in result.text
    assert result.token_ids == greedy.token_ids[:len(result.token_ids)]
    assert len(result.token_ids) < len(greedy.token_ids)


def test_stop_string_absent_changes_nothing(tiny_runtime, greedy):
    result = _complete(tiny_runtime, max_new_tokens=24, stop=("\x00never\x00",))
    assert (result.text, result.token_ids, result.finish_reason) == (greedy.text, greedy.token_ids, "length")


def test_min_new_tokens_defers_stop_strings(tiny_runtime, greedy):
    stop = greedy.text[:2]
    assert _complete(tiny_runtime, max_new_tokens=24, stop=(stop,)).text == ""
    late = _complete(tiny_runtime, max_new_tokens=24, stop=(stop,), min_new_tokens=5)
    # the occurrence at the start is passed over (as vLLM does); the answer is the greedy one
    assert len(late.token_ids) >= 5 and late.token_ids == greedy.token_ids[:len(late.token_ids)]
    assert late.text.startswith(stop) and greedy.text.startswith(late.text)


@pytest.mark.parametrize("params", [dict(presence_penalty=2.0), dict(frequency_penalty=2.0),
                                    dict(repetition_penalty=5.0)])
def test_penalties_change_the_greedy_answer(tiny_runtime, greedy, params):
    result = _complete(tiny_runtime, max_new_tokens=24, **params)
    assert len(result.token_ids) == 24 and result.token_ids != greedy.token_ids


def test_seeded_sampling_repeats_and_other_seeds_differ(tiny_runtime):
    a = _complete(tiny_runtime, max_new_tokens=16, temperature=1.0, seed=11)
    b = _complete(tiny_runtime, max_new_tokens=16, temperature=1.0, seed=11)
    c = _complete(tiny_runtime, max_new_tokens=16, temperature=1.0, seed=12)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    top1 = _complete(tiny_runtime, max_new_tokens=16, temperature=1.0, seed=13, top_k=1)
    assert top1.token_ids == _complete(tiny_runtime, max_new_tokens=16).token_ids  # top-1 sampling is greedy


def test_stop_ids_end_unless_ignore_eos():
    sampler = Sampler(SamplingParams(min_new_tokens=2), stop_ids={3})
    logits = torch.tensor([0.0, 1.0, 2.0, 9.0], dtype=torch.float64)
    assert sampler.pick(logits) == 2  # the end-of-turn token banned below the minimum
    sampler.observe(2)
    sampler.observe(2)
    assert sampler.pick(logits) == 3
    assert not SamplingParams(ignore_eos=True).plain_greedy and SamplingParams().plain_greedy


def test_penalties_follow_openai_and_vllm_formulas():
    logits = torch.tensor([4.0, -2.0, 1.0], dtype=torch.float64)
    s = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), prompt_ids=[1])
    s.observe(0)
    s.observe(0)
    assert s.adjusted(logits).tolist() == [4.0 - 0.5 - 0.5, -2.0, 1.0]
    r = Sampler(SamplingParams(repetition_penalty=2.0), prompt_ids=[1])
    r.observe(0)
    assert r.adjusted(logits).tolist() == [2.0, -4.0, 1.0]  # positive divided, negative multiplied
    plain = Sampler(SamplingParams())
    assert plain.adjusted(logits) is logits  # nothing asked: no copy


@pytest.mark.parametrize(("params", "message"), [
    (dict(presence_penalty=3.0), "presence_penalty"), (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(top_k=-1), "top_k"),
    (dict(min_new_tokens=9, max_new_tokens=8), "min_new_tokens"), (dict(stop=("",)), "stop"),
    (dict(stop=("a", "b", "c", "d", "e")), "stop"),
    (dict(logprobs=True, top_logprobs=21), "top_logprobs"), (dict(top_logprobs=2), "top_logprobs"),
])
def test_out_of_range_values_are_refused_by_name(params, message):
    with pytest.raises(InvalidInput, match=message):
        SamplingParams(**params).validate()


def test_stop_text_finds_a_string_split_across_tokens():
    stop = StopText(("END",))
    assert stop.holdback == 2
    assert stop.find("SELECT 1 E") is None and stop.find("SELECT 1 EN") is None
    assert stop.find("SELECT 1 END;") == 9
    assert StopText(()).find("anything") is None


def test_text_deltas_hold_back_a_possible_stop_string():
    pieces = ["SEL", "ECT", " E", "ND"]
    deltas = TextDeltas(lambda ids: "".join(pieces[i] for i in ids), holdback=2)
    sent = "".join(deltas.push(i) for i in range(3))
    assert sent == "SELECT"  # " E" could start "END": held back
    assert deltas.flush("SELECT") == ""  # the request cut the text before the stop string
    plain = TextDeltas(lambda ids: "".join(pieces[i] for i in ids))
    assert "".join(plain.push(i) for i in range(4)) + plain.flush() == "SELECT END"


def test_logprobs_are_the_models_log_softmax_and_the_top_tokens():
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0], dtype=torch.float64)
    lp = token_logprobs(logits, 2, top=2)
    expected = torch.log_softmax(logits, -1)
    assert lp.logprob == float(expected[2])
    assert lp.top == ((1, float(expected[1])), (2, float(expected[2])))
    sampler = Sampler(SamplingParams(logprobs=True, top_logprobs=1, presence_penalty=2.0))
    sampler.observe(1)
    assert sampler.pick(logits) == 2  # the penalty moved the pick, not the reported distribution
    assert sampler.last_logprob.top == ((1, float(expected[1])),)
    assert not SamplingParams(logprobs=True).plain_greedy  # no answer-ahead tokens: they have no logits


def test_a_request_reports_each_tokens_logprob(tiny_runtime, greedy):
    result_request = tiny_runtime.start_complete(DB, QUESTION, "prefix",
                                                 SamplingParams(max_new_tokens=8, logprobs=True, top_logprobs=3))
    result = result_request.result(60)
    assert result.token_ids == greedy.token_ids[:8]  # asking for logprobs changes no token
    assert [lp.token_id for lp in result_request.logprobs] == result.token_ids
    for lp in result_request.logprobs:
        assert len(lp.top) == 3 and lp.top[0] == (lp.token_id, lp.logprob)  # greedy: the pick is the top one
        assert lp.logprob <= 0 and [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
