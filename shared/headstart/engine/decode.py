"""One decode step, for every path that decodes: a submit's answer
(`GenerationRequest`) and the answer decoded ahead during a pause
(`AnswerAhead`).

A decode step extends the cache by the last picked token, keeping the
logits after it, and picks the next token from them. As a row
(`headstart.engine.steps`): `decode_row` prepares it without running the
model; when it has run, its commit picks the token and hands it on. A step
that left the forward between layers (preempted) hands on None: the cache
is unchanged and the same step may run again.
"""

from __future__ import annotations

from typing import Callable

import torch

from headstart.engine.kv import KVState
from headstart.engine.steps import Row, RowResult


def pick_token(logits: torch.Tensor, params=None, generator: torch.Generator | None = None) -> int:
    """Greedy argmax (`params` None or temperature 0), or temperature +
    nucleus sampling (`params`: a `SamplingParams`)."""
    if params is None or params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def decode_row(model, state: KVState, last_token: int, should_abort: Callable[[], bool] | None,
               on_token: Callable[[int | None], bool], params=None,
               generator: torch.Generator | None = None) -> Row:
    """The row of one decode step on `state`: extend by `last_token`, then
    `on_token(next token)` (or `on_token(None)` when the row left the
    forward); its return value says whether the job has more to do. A
    forward error is raised to the row's job."""

    def commit(result: RowResult) -> bool:
        if result.error is not None:
            raise result.error
        if not result.ran:
            return on_token(None)
        return on_token(pick_token(state.last_logits, params, generator))

    return Row(model, state, [last_token], True, should_abort, commit)
