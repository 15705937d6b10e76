"""One greedy answer on a snapshot of a data session's live cache.

A `Snapshot` is taken on the worker thread, under the session's lock: a
`KVState.share()` of the live cache (its tensors are never written in
place, so ingestion, a shift or a rebuild swap after it cannot change what
the snapshot reads) with the data version and rows it stands for. An
`Answer` extends its own share of the snapshot by the question's tokens,
then decodes greedily one token per step, and its tail is dropped when it
is done: in place in the paper's words (extend, decode, crop back), without
touching the live cache.

Both `DataSession.query` (SUBMIT) and `DataSession.evaluate` (FLASH) answer
this way, so a flash answer is the same tokens as a query on the same
version: one mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headstart.engine.requests.decode_step import decode_row, decoded_tokens
from headstart.engine.kv.state import KVState
from headstart.engine.runner.model_runner import ModelRunner
from headstart.engine.runner.rows import Row, RowResult


@dataclass(frozen=True)
class Snapshot:
    """The live cache as one data version: `kv` (a share), the version, the
    rows in the cache and the context's tokens."""

    kv: KVState
    version: int
    rows: int
    context: int


def logit_gap(logits: torch.Tensor) -> float:
    """Top-1 minus top-2 logit: the paper's confidence of a token (§3.9.2)."""
    top = torch.topk(logits.double(), 2).values
    return float(top[0] - top[1])


class Answer:
    """A question's greedy answer on a snapshot, one row per step.

    Args:
        question_ids: the tokens after the rows (`DataPrompt.question_ids`).
        stop_ids: tokens that end the answer (not kept).
    """

    def __init__(self, runner: ModelRunner, question_ids: list[int], max_new_tokens: int, stop_ids):
        self.runner, self.question_ids = runner, question_ids
        self.max_new_tokens, self.stop_ids = max_new_tokens, stop_ids
        self.kv: KVState | None = None
        self.tokens: list[int] = []
        self.first_logits: torch.Tensor | None = None
        self.asked = self.done = False

    def start(self, snapshot: Snapshot) -> None:
        self.kv = snapshot.kv.share()

    @property
    def tail_bytes(self) -> int:
        """Private bytes of the question and answer so far (the cell budget)."""
        kv = self.kv
        return 0 if kv is None else kv.nbytes()

    def row(self) -> Row:
        """The next step's row: the question (keeping its logits), then one decode step."""
        if not self.asked:
            return Row(self.kv, self.question_ids, True, runner=self.runner)
        return decode_row(self.runner, self.kv, self.tokens[-1])

    def commit(self, row: Row, result: RowResult) -> bool:
        """The row of the last `row()` ran: its token kept; True while the answer goes on."""
        if result.error is not None:
            raise result.error
        if not result.ran:  # it left the forward: the same row runs again
            return True
        if not self.asked:
            self.asked = True
            return self._on_token(int(torch.argmax(self.kv.last_logits)))
        return self._on_token(decoded_tokens(row)[0])

    def _on_token(self, token: int) -> bool:
        if self.first_logits is None:
            self.first_logits = self.kv.last_logits.clone()
        if token not in self.stop_ids:
            self.tokens.append(token)
        more = token not in self.stop_ids and len(self.tokens) < self.max_new_tokens
        if not more:
            self.done, self.kv = True, None  # crop back: the tail goes with its share
        return more
