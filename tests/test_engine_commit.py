"""The catch-up rule (`engine/requests/catch_up.py`) from a table of cache/target situations, no model;
`start_catch_up` and the one decode step (`engine/requests/decode_step.py`) on the tiny model."""

from __future__ import annotations

import pytest
import torch

from headstart.engine.requests.catch_up import CatchUpPlan, plan_catch_up
from headstart.engine.kv.state import KVState

LOGITS = torch.zeros(4)

# (cached ids, logits at hand, target, chunk, want logits, expected step)
CASES = [
    ("empty cache", [], False, [1, 2, 3], 8, True, CatchUpPlan(0, [1, 2, 3], True)),
    ("extend the rest", [1, 2], True, [1, 2, 3, 4], 8, True, CatchUpPlan(2, [3, 4], True)),
    ("one chunk at a time", [1], True, [1, 2, 3, 4], 2, True, CatchUpPlan(1, [2, 3], False)),
    ("crop an edit", [1, 2, 9, 9], True, [1, 2, 3], 8, True, CatchUpPlan(2, [3], True)),
    ("caught up with logits: nothing", [1, 2, 3], True, [1, 2, 3], 8, True, CatchUpPlan(3, [], True)),
    ("caught up without logits: backstep", [1, 2, 3], False, [1, 2, 3], 8, True, CatchUpPlan(2, [3], True)),
    ("past the target: backstep", [1, 2, 3, 4], True, [1, 2, 3], 8, True, CatchUpPlan(2, [3], True)),
    ("logits not wanted: no backstep", [1, 2, 3, 4], True, [1, 2, 3], 8, False, CatchUpPlan(3, [], True)),
    ("empty target", [1, 2], True, [], 8, True, CatchUpPlan(0, [], True)),
]


@pytest.mark.parametrize("situation,cached,logits,target,chunk,want,expected", CASES, ids=[c[0] for c in CASES])
def test_plan_catch_up(situation, cached, logits, target, chunk, want, expected):
    kv = KVState(list(cached), None, LOGITS if logits else None)
    assert plan_catch_up(kv, target, chunk, want) == expected
    assert kv.ids == cached  # planning changes nothing


def test_start_catch_up_crops_and_prepares_the_row(tiny_runtime):
    """`start_catch_up` (what a typing step and a submit's prefill both call):
    the cache is cropped to what the step keeps, and the row extends it by the
    chunk with logits only when the chunk ends the target and they are wanted."""
    from headstart.engine.requests.catch_up import start_catch_up
    from headstart.engine.sched.forwards import run_rows

    runner = tiny_runtime.runner
    kv = runner.prefill([1, 2, 9, 9])
    catch_up = start_catch_up(runner, kv, [1, 2, 3, 4, 5], 2, True)
    assert (catch_up.dropped, kv.ids, catch_up.plan) == (2, [1, 2], CatchUpPlan(2, [3, 4], False))
    assert catch_up.row.new_ids == [3, 4] and catch_up.row.want_logits is False and catch_up.row.state is kv
    results, _ = run_rows([catch_up.row], 8)
    assert results[0].ran and kv.ids == [1, 2, 3, 4] and kv.last_logits is None
    last = start_catch_up(runner, kv, [1, 2, 3, 4, 5], 2, False)
    assert last.row.new_ids == [5] and last.row.want_logits is False  # the policy keeps no logits
    last = start_catch_up(runner, kv, [1, 2, 3, 4, 5], 2, True)
    assert last.row.want_logits is True


def test_one_decode_step_for_answers_and_answer_ahead(tiny_runtime):
    """`decode_row` then `decoded_tokens`: once the row ran, the token picked
    from the new logits (greedy: the argmax); a row that left the forward
    leaves the cache unchanged."""
    from headstart.engine.requests.decode_step import decode_row, decoded_tokens
    from headstart.engine.sched.forwards import run_rows

    runner = tiny_runtime.runner
    kv = runner.prefill([1, 2, 3])
    reference = runner.prefill([1, 2, 3, 4])
    row = decode_row(runner, kv, 4, lambda: True)
    results, _ = run_rows([row], 8)
    assert not results[0].ran and results[0].error is None and kv.ids == [1, 2, 3]  # left before layer 0
    row = decode_row(runner, kv, 4)
    results, _ = run_rows([row], 8)
    assert results[0].ran and kv.ids == [1, 2, 3, 4]
    assert decoded_tokens(row) == [int(torch.argmax(reference.last_logits))]


def test_a_drafted_decode_step_keeps_what_one_at_a_time_steps_pick(tiny_runtime):
    """With a draft, one forward checks every drafted token: the tokens kept are the
    greedy ones (up to the first wrong guess, plus the model's own token after it),
    the cache holds what precedes the last kept token and its logits; a stop id or
    the limit ends the kept tokens early."""
    from headstart.engine.requests.decode_step import decode_row, decoded_tokens
    from headstart.engine.sched.forwards import run_rows

    runner = tiny_runtime.runner
    prompt = [11, 12, 13]
    greedy, reference = [], runner.prefill(prompt + [14])
    for _ in range(4):
        greedy.append(int(torch.argmax(reference.last_logits)))
        runner.extend(reference, [greedy[-1]])

    def step(guess, limit=8, stop=frozenset()):
        kv = runner.prefill(prompt)
        row = decode_row(runner, kv, 14, None, guess, limit)
        results, _ = run_rows([row], 64)
        assert results[0].ran
        return decoded_tokens(row, None, limit, stop), kv
    right = greedy[:3]
    kept, kv = step(right)  # every guess right: the three and the model's fourth token
    assert kept == greedy[:4] and kv.ids == prompt + [14] + greedy[:3]
    assert torch.equal(torch.argmax(kv.last_logits), torch.tensor(greedy[3]))
    wrong = [greedy[0], (greedy[1] + 1) % 1000, greedy[2]]
    kept, kv = step(wrong)  # the second guess wrong: its own token replaces it
    assert kept == greedy[:2] and kv.ids == prompt + [14, greedy[0]]
    kept, _ = step(right, limit=2)
    assert kept == greedy[:2]
    kept, kv = step(right, stop={greedy[1]})
    assert kept == greedy[:2] and kv.ids == prompt + [14, greedy[0]]


def test_prompt_lookup_drafts_follow_the_latest_recurring_ngram():
    """The drafter proposes what followed the latest earlier occurrence of the context's last
    n tokens (longest n first), nothing when nothing recurs; the bench's replay counts one
    forward per step and the tokens each checks."""
    from bench.prompt_lookup import simulate
    from headstart.engine.requests.prompt_lookup import draft

    context = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert draft(context, 3) == [4, 7, 1]  # [1, 2] last seen before 4 (the latest), over [1, 2] before 3
    assert draft(context + [3], 2) == [9, 1]  # [1, 2, 3] recurs: its follower, longest n-gram first
    assert draft([5, 6, 7], 4) == [] and draft(context, 0) == []
    tokens, sizes = simulate([([10, 11, 12, 13], [11, 12, 13, 99])], k=3, ngram_min=1)
    # answer 11 12 13 EOS: the first from the prefill; then one forward of 4 (11 and the draft 12 13 11):
    # 12 and 13 right, the model's own token after them (EOS) from the same forward
    assert (tokens, sizes) == (3, [4])
