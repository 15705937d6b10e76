"""One decode step, for every path that decodes: a submit's answer
(`GenerationRequest`) and the answer decoded ahead during a pause
(`AnswerAhead`).

A decode step extends the cache by the last picked token, keeping the
logits after it, and picks the next token from them. As a row
(`headstart.engine.steps`): `decode_row` prepares it without running the
model; when it has run, its commit picks the token and hands it on. A step
that left the forward between layers (preempted) hands on None: the cache
is unchanged and the same step may run again.

With a draft (greedy only; `prompt_lookup.draft`), the step runs the last
token and the drafted ones in one forward with the logits of every
position, keeps the drafted tokens the model picks itself and the token it
picks after them, crops the rest off the cache, and hands on all the
tokens it kept: the very tokens one-at-a-time steps would pick.
"""

from __future__ import annotations

from typing import Callable

import torch

from headstart.engine.kv import KVState, kept_logits
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
               on_tokens: Callable[[list[int] | None], bool], params=None,
               generator: torch.Generator | None = None, draft: list[int] = (), limit: int = 1,
               stop_ids: set[int] = frozenset()) -> Row:
    """The row of one decode step on `state`: extend by `last_token` (and the
    `draft`, greedy only, at most `limit - 1` tokens), then `on_tokens(the
    tokens kept)` (or `on_tokens(None)` when the row left the forward); its
    return value says whether the job has more to do. The tokens kept end
    at the first stop id or after `limit` tokens; the cache then holds
    everything before the last of them and the logits it was picked from.
    A forward error is raised to the row's job."""
    greedy = params is None or params.temperature == 0
    draft = list(draft)[:max(0, limit - 1)] if greedy else []
    ids = [last_token, *draft]
    row = Row(model, state, ids, True, should_abort, lambda result: commit(result), logits_positions=len(ids))

    def commit(result: RowResult) -> bool:
        if result.error is not None:
            raise result.error
        if not result.ran:
            return on_tokens(None)
        if not draft:
            return on_tokens([pick_token(state.last_logits, params, generator)])
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
