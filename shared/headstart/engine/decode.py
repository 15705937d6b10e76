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
from headstart.engine.sampling import pick_token
from headstart.engine.steps import Row, RowResult


def decode_row(model, state: KVState, last_token: int, should_abort: Callable[[], bool] | None,
               on_token: Callable[[int | None], bool],
               pick: Callable[[torch.Tensor], int] | None = None) -> Row:
    """The row of one decode step on `state`: extend by `last_token`, then
    `on_token(next token)` (or `on_token(None)` when the row left the
    forward); its return value says whether the job has more to do. The
    token is `pick(logits)` (a request's `Sampler.pick`; None: greedy
    argmax). A forward error is raised to the row's job."""
    pick = pick or pick_token

    def commit(result: RowResult) -> bool:
        if result.error is not None:
            raise result.error
        if not result.ran:
            return on_token(None)
        return on_token(pick(state.last_logits))

    return Row(model, state, [last_token], True, should_abort, commit)
