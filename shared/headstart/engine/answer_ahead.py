"""Answer-ahead: greedy answer tokens decoded while the user pauses.

Once a session's cache holds the whole prompt with its logits and the worker
has nothing better to do, the session keeps decoding greedily at IDLE
priority. Greedy decoding of a fixed prompt is deterministic, and these are
the very forward passes the submit would run (the same decode step,
`headstart.engine.decode`, on the same cache), so if the user presses Enter
without changing the text, the first tokens of the answer are already
known: they stream at once, and decoding goes on from there. Any edit crops
them away (they count as wasted tokens).

Invariant while tokens exist: the cache holds `prompt + tokens[:-1]` and its
last logits are the ones `tokens[-1]` was picked from.
"""

from __future__ import annotations

from typing import Callable

from headstart.engine.decode import decode_row, pick_token
from headstart.engine.kv import KVState
from headstart.engine.model_runner import ModelRunner
from headstart.engine.prompt_lookup import draft
from headstart.engine.steps import Row


class AnswerAhead:
    def __init__(self, max_tokens: int, stop_ids: set[int], draft_tokens: int = 0):
        self.max_tokens = max_tokens
        self.stop_ids = stop_ids
        self.draft_tokens = draft_tokens  # prompt-lookup drafts per step (`prompt_lookup`; 0: none)
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.tokens = []

    def wants_more(self, kv: KVState, prompt_ids: list[int]) -> bool:
        """Whether another step is worth it: enabled, the cache is exactly on
        this prompt's answer path, no stop token yet, under the budget."""
        if self.max_tokens <= 0 or len(self.tokens) >= self.max_tokens:
            return False
        if self.tokens and self.tokens[-1] in self.stop_ids:
            return False
        if not self.tokens:
            return kv.ids == prompt_ids and kv.last_logits is not None
        return self.usable_for(kv.ids, prompt_ids) != []

    def take_first(self, kv: KVState) -> None:
        """The first answer token: the argmax of the logits at hand (worker
        thread; no forward pass). Requires `wants_more` and no token yet."""
        self.tokens.append(pick_token(kv.last_logits))

    def step_row(self, runner: ModelRunner, kv: KVState, prompt_ids: list[int], should_abort: Callable[[], bool] | None,
                 then: Callable[[int], bool]) -> Row:
        """The decode step for one more token, or several with a draft (after
        `take_first`). Once it ran, the tokens are kept and `then(how many)`
        says whether the job goes on; `then(0)` when it left the forward
        (cache unchanged)."""

        def on_tokens(tokens: list[int] | None) -> bool:
            self.tokens.extend(tokens or [])
            return then(len(tokens or []))

        guess = draft(prompt_ids + self.tokens, self.draft_tokens) if self.draft_tokens else []
        return decode_row(runner, kv, self.tokens[-1], should_abort, on_tokens, draft=guess,
                          limit=self.max_tokens - len(self.tokens), stop_ids=self.stop_ids)

    def usable_for(self, kv_ids: list[int], prompt_ids: list[int]) -> list[int]:
        """The tokens that start the greedy answer to `prompt_ids`, or [].

        Safe to call off the worker with a copy of the cache ids: the tokens
        are read once, and a torn read fails the length check."""
        tokens, n = list(self.tokens), len(prompt_ids)
        if tokens and len(kv_ids) == n + len(tokens) - 1 and kv_ids[:n] == prompt_ids and kv_ids[n:] == tokens[:-1]:
            return tokens
        return []
