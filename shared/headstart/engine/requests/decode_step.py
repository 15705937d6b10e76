"""One decode step, for every path that decodes: a submit's answer
(`requests.generation`), the answer decoded ahead during a pause
(`sessions.answer_ahead`) and a data session's answers.

A decode step extends the cache by the last picked token, keeping the
logits after it, and picks the next token from them: `decode_row` prepares
the row without running the model; once it ran, its job's commit calls
`decoded_tokens`. A row that left the forward (preempted) leaves the cache
unchanged and may run again.

With a draft (plain greedy decoding only; `requests.prompt_lookup`), the
step runs the last token and the drafted ones in one forward with the
logits of every position, keeps the drafted tokens the model picks itself
and the token it picks after them, and crops the rest off the cache: the
very tokens one-at-a-time steps would pick.
"""

from __future__ import annotations

from typing import Callable

import torch

from headstart.engine.kv.state import KVState, kept_logits
from headstart.engine.requests.sampling import pick_token
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row


def decode_row(runner: ModelRunner, state: KVState, last_token: int, should_abort: Callable[[], bool] | None = None,
               draft: list[int] = (), limit: int = 1) -> Row:
    """The row of one decode step on `state`: extend by `last_token` and (when
    `limit` allows more than one token) the `draft`, with the logits of each."""
    ids = [last_token, *list(draft)[:max(0, limit - 1)]]
    return Row(state, ids, True, should_abort, logits_positions=len(ids), runner=runner)


def decoded_tokens(row: Row, pick: Callable[[torch.Tensor], int] | None = None, limit: int = 1,
                   stop_ids: set[int] = frozenset()) -> list[int]:
    """The tokens a decode row that ran gives (its job's commit). Without a
    draft: `pick(logits)` (a request's `Sampler.pick`; None: greedy argmax).
    With one: the argmax of each position up to the first wrong guess,
    ending early at a stop id or after `limit` tokens; the cache is cropped
    to everything before the last of them and keeps the logits it was
    picked from."""
    state, draft = row.state, row.new_ids[1:]
    if not draft:
        return [(pick or pick_token)(state.last_logits)]
    logits = row.position_logits  # [1 + len(draft), vocab]: after the last token, after each drafted one
    kept = []
    for i, token in enumerate(logits.argmax(dim=-1).tolist()):
        kept.append(token)
        if token in stop_ids or len(kept) >= limit or i == len(draft) or token != draft[i]:
            break
    state.crop(state.num_tokens - (len(draft) + 1 - len(kept)))  # the rejected drafted tokens
    state.last_logits = kept_logits(logits[len(kept) - 1])
    return kept
