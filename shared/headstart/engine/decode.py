"""One decode step, for every path that decodes: a submit's answer
(`GenerationRequest`) and the answer decoded ahead during a pause
(`AnswerAhead`).

A decode step extends the cache by the last picked token, keeping the
logits after it, and picks the next token from them. As a row
(`headstart.engine.steps`): `decode_row` prepares it without running the
model; when it has run, its commit picks the token and hands it on. A step
that left the forward between layers (preempted) hands on None: the cache
is unchanged and the same step may run again.

With a draft (plain greedy decoding only; `prompt_lookup.draft`), the step
runs the last token and the drafted ones in one forward with the logits of
every position, keeps the drafted tokens the model picks itself and the
token it picks after them, crops the rest off the cache, and hands on all
the tokens it kept: the very tokens one-at-a-time steps would pick.
"""

from __future__ import annotations

from typing import Callable

import torch

from headstart.engine.kv import KVState, kept_logits
from headstart.engine.model_runner import ModelRunner
from headstart.engine.sampling import pick_token
from headstart.engine.steps import Row, RowResult


def decode_row(runner: ModelRunner, state: KVState, last_token: int, should_abort: Callable[[], bool] | None,
               on_tokens: Callable[[list[int] | None], bool],
               pick: Callable[[torch.Tensor], int] | None = None, draft: list[int] = (), limit: int = 1,
               stop_ids: set[int] = frozenset()) -> Row:
    """The row of one decode step on `state`: extend by `last_token`, then
    `on_tokens(the tokens kept)` (or `on_tokens(None)` when the row left the
    forward); its return value says whether the job has more to do. The
    token is `pick(logits)` (a request's `Sampler.pick`; None: greedy
    argmax). With a `draft` (the caller passes one for plain greedy decoding
    only; at most `limit - 1` tokens are checked) the tokens kept are the
    argmax of each position up to the first wrong guess, ending early at a
    stop id or after `limit` tokens; the cache then holds everything before
    the last of them and the logits it was picked from. A forward error is
    raised to the row's job."""
    pick = pick or pick_token
    draft = list(draft)[:max(0, limit - 1)]
    ids = [last_token, *draft]
    row = Row(runner, state, ids, True, should_abort, lambda result: commit(result), logits_positions=len(ids))

    def commit(result: RowResult) -> bool:
        if result.error is not None:
            raise result.error
        if not result.ran:
            return on_tokens(None)
        if not draft:
            return on_tokens([pick(state.last_logits)])
        logits = row.position_logits  # [1 + len(draft), vocab]: after last_token, after each drafted token
        kept = []
        for i, token in enumerate(logits.argmax(dim=-1).tolist()):
            kept.append(token)
            if token in stop_ids or len(kept) >= limit or i == len(draft) or token != draft[i]:
                break
        state.crop(state.num_tokens - (len(draft) + 1 - len(kept)))  # the rejected drafted tokens
        state.last_logits = kept_logits(logits[len(kept) - 1])
        return on_tokens(kept)

    return row
