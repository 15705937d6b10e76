"""The values a data session takes and gives: its settings, a push's ack, a query's result."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headstart.data.rows import DataRow
from headstart.engine.errors import InvalidInput

RETENTION_MODES = ("shift", "rebuild")
# The paper's fast-answer vocabulary V (§3.9.4): the speculative exit answers
# only with one of these words (or an unsigned integer), never with the
# first token of a longer answer (`headstart.data.ready`).
FAST_ANSWERS = frozenset({"yes", "no", "true", "false", "up", "down"})


@dataclass(frozen=True)
class DataSettings:
    """retention_tokens: bound of the sliding region; retention: "shift" or
    "rebuild"; retention_keep: the fraction of the bound left once it is passed;
    buffer_rows: unprocessed rows kept per session; batch_rows:
    rows one ingestion step adds; max_row_chars / max_row_tokens: a row's
    limits; max_question_chars: a question's limit; ready_exit_gap: the
    speculative exit's threshold (None: off; see `headstart.data.ready`);
    ready_exit_vocabulary: the one-word answers it may give (the paper's
    fast-answer vocabulary; unsigned integers always qualify)."""

    retention_tokens: int = 2048
    retention: str = "rebuild"
    # past the bound the oldest rows leave until this fraction of it remains
    # (`ingest.retention_cut`): a rebuild per half a region, not per batch
    retention_keep: float = 0.5
    buffer_rows: int = 1024
    batch_rows: int = 32
    max_row_chars: int = 512
    max_row_tokens: int = 128
    max_question_chars: int = 2000
    ready_exit_gap: float | None = None
    ready_exit_vocabulary: frozenset[str] = FAST_ANSWERS

    def __post_init__(self):
        if self.retention not in RETENTION_MODES:
            raise InvalidInput(f"retention must be one of {RETENTION_MODES}, not {self.retention!r}")
        for name in ("retention_tokens", "buffer_rows", "batch_rows", "max_row_chars", "max_row_tokens"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{name} must be >= 1")
        if not 0 < self.retention_keep <= 1:
            raise InvalidInput("retention_keep must be in (0, 1]")
        if self.max_row_tokens > self.retention_tokens:
            raise InvalidInput("max_row_tokens must not exceed retention_tokens")
        if self.ready_exit_gap is not None and not self.ready_exit_gap >= 0:
            raise InvalidInput("ready_exit_gap must be None (off) or a number >= 0")
        words = self.ready_exit_vocabulary
        if isinstance(words, str) or not all(isinstance(w, str) and w.strip() for w in words):
            raise InvalidInput("ready_exit_vocabulary must be a collection of non-empty words")
        object.__setattr__(self, "ready_exit_vocabulary", frozenset(w.strip().lower() for w in words))

    @property
    def retention_window(self) -> tuple[int, int]:
        """(bound, what is kept once it is passed) in tokens (`ingest.retention_cut`)."""
        return self.retention_tokens, max(1, int(self.retention_tokens * self.retention_keep))


@dataclass(frozen=True)
class PushAck:
    """seqs: the pushed rows' sequence numbers; dropped: oldest unprocessed rows
    this push pushed out of the full buffer (their seqs in `dropped_seqs`);
    dropped_total: the session's count so far; buffered: rows waiting now."""

    seqs: tuple[int, ...]
    dropped: int
    dropped_seqs: tuple[int, ...]
    dropped_total: int
    buffered: int


@dataclass(frozen=True)
class QueryResult:
    """text and its sql, the data version and rows the answer saw, the answer's
    token ids, the context it attended to (tokens before the question), the
    logits of its first token (drift measurements) and its wall time.
    speculative: answered from the ready-position logits (one token, no
    forward), see `DataSettings.ready_exit_gap`."""

    text: str
    sql: str
    data_version: int
    rows_in_cache: int
    context_tokens: int
    token_ids: list[int]
    first_logits: torch.Tensor = field(repr=False)
    seconds: float
    speculative: bool = False


@dataclass(frozen=True)
class VersionEvent:
    """After one committed ingestion batch: the new data version (the seq of
    the newest row in the cache), rows the batch added, the session's
    dropped rows so far, and rows now in the cache; lag_versions /
    lag_seconds: acknowledged pushes still behind this version and the
    oldest one's age (`headstart.data.lag`): a version with pushes behind it
    is about to be superseded (the flash worker answers the newest)."""

    version: int
    rows_added: int
    dropped_total: int
    rows_in_cache: int
    lag_versions: int = 0
    lag_seconds: float = field(default=0.0, compare=False)  # a clock reading: not part of what happened


@dataclass(frozen=True)
class FlashAnswer:
    """One question evaluated at data `version` (`DataSession.evaluate`): the
    answer's text and SQL, the SQL's result on the working copy at that
    version (`error`: why it did not run; rows then empty), the top-1 minus
    top-2 logit of the answer's first token, and the question's wall time
    (its model steps and its SQL); token_ids: the answer's tokens."""

    question: str
    version: int
    text: str
    sql: str
    columns: list[str]
    rows: list[tuple]
    error: str | None
    logit_gap: float
    seconds: float
    token_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RowEntry:
    """A buffered or cached row: its sequence number, the row, its line's tokens."""

    seq: int
    row: DataRow
    ids: list[int]
