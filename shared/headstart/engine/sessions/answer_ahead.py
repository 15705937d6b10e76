"""Answer-ahead: greedy answer tokens decoded while the user pauses.

Once a session's cache holds the whole prompt with its logits and the worker
has nothing better to do, the session keeps decoding greedily at IDLE
priority (`AheadWork`). Greedy decoding of a fixed prompt is deterministic,
and these are the very forward passes the submit would run (the same decode
step, `requests.decode_step`, on the same cache), so if the user presses
Enter without changing the text, the first tokens of the answer are already
known: they stream at once, and decoding goes on from there. Any edit crops
them away (they count as wasted tokens).

Invariant while tokens exist: the cache holds `prompt + tokens[:-1]` and its
last logits are the ones `tokens[-1]` was picked from.
"""

from __future__ import annotations

from dataclasses import dataclass

from headstart.engine.kv.state import KVState
from headstart.engine.requests.decode_step import decode_row, decoded_tokens
from headstart.engine.requests.prompt_lookup import draft
from headstart.engine.requests.sampling import pick_token
from headstart.engine.runner.rows import Row, RowResult
from headstart.engine.sched.jobs import Job, JobWork
from headstart.engine.sessions.policy import looks_complete


class AnswerAhead:
    """The greedy answer tokens decoded ahead for one session's prompt."""

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

    def usable_for(self, kv_ids: list[int], prompt_ids: list[int]) -> list[int]:
        """The tokens that start the greedy answer to `prompt_ids`, or [].

        Safe to call off the worker with a copy of the cache ids: the tokens
        are read once, and a torn read fails the length check."""
        tokens, n = list(self.tokens), len(prompt_ids)
        if tokens and len(kv_ids) == n + len(tokens) - 1 and kv_ids[:n] == prompt_ids and kv_ids[n:] == tokens[:-1]:
            return tokens
        return []


@dataclass(frozen=True)
class AheadStep:
    """What an answer-ahead step read of its session: the job it runs as, the
    prompt it answers, and the extension it puts in flight."""

    job: Job | None
    prompt_ids: list[int]
    inflight: object  # the session's `InFlight`


class AheadWork(JobWork):
    """The answer-ahead job of `session` (a `Session`): one decode step of its
    greedy answer per step (after `AnswerAhead.take_first`)."""

    def __init__(self, session):
        self.session = session
        self._pending: AheadStep | None = None

    def step(self) -> "Row | bool":
        session = self.session
        step = session.read_ahead_step()
        if step is None:  # stopped by an update or a submit
            return False
        ahead = session.ahead
        guess = draft(step.prompt_ids + ahead.tokens, ahead.draft_tokens) if ahead.draft_tokens else []
        self._pending = step
        return decode_row(session.runner, session.kv_state, ahead.tokens[-1],
                          lambda: session.should_stop(step.inflight, step.job), guess,
                          ahead.max_tokens - len(ahead.tokens))

    def commit(self, row: Row, result: RowResult) -> bool:
        step, self._pending = self._pending, None
        session, ahead = self.session, self.session.ahead
        if result.error is not None:
            session.untrack(step.inflight)
            raise result.error
        kept = []
        if result.ran:  # the cache grew by the step's token and the drafted ones kept
            kept = decoded_tokens(row, None, ahead.max_tokens - len(ahead.tokens), ahead.stop_ids)
            ahead.tokens.extend(kept)
        return session.after_ahead_step(step, len(kept))

    def decoding(self) -> bool:
        """A decode step to the scheduler (it rides in others' forwards and
        yields only to a new prefill) once the text reads as a finished
        question: Enter usually follows within a second, and each token
        decoded before it is one inter-token gap off the answer's last token.
        Before that (a pause mid-question) it runs only when the worker has
        nothing else to do: the next keystroke would crop what it decoded."""
        return looks_complete(self.session.text)
