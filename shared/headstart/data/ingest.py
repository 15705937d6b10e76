"""A data session's rows on their way in: validation of a push, sequence
numbers, the ingestion job (`Ingestion`, a part of `DataSession`), and the
rows a rebuild keeps.

Sequence numbers are the caller's when it gives them (the gateway owns them:
it persists rows under its numbers before acking), else the session's own.
Either way they are strictly increasing across the session's life, so "the
seq of the newest row in the cache" names a data version, and a session
rebuilt from the same rows reaches the same version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from headstart.data.lag import IngestionBehind, LagBound
from headstart.data.prompt import DataPrompt
from headstart.data.rows import DataRow, validate_row
from headstart.data.states import DataState
from headstart.data.types import DataSettings, PushAck, RowEntry, VersionEvent
from headstart.engine.errors import InvalidInput, SeqsBehind
from headstart.engine.sched.jobs import Call, Priority
from headstart.engine.runner.rows import Row, RowResult

log = logging.getLogger(__name__)


def validate_rows(prompt: DataPrompt, settings: DataSettings, rows: Sequence,
                  label=lambda index: f"row {index}") -> list[tuple[DataRow, list[int]]]:
    """Each raw row (`{"table": name, "values": {column: value}}`) as a
    validated `DataRow` and its line's tokens; the first bad row raises
    InvalidInput named by `label(index)`."""
    out = []
    for index, raw in enumerate(rows):
        if not isinstance(raw, dict):
            raise InvalidInput(f"{label(index)}: must be an object with 'table' and 'values'")
        try:
            row = validate_row(prompt.schema, raw.get("table"), raw.get("values"), settings.max_row_chars)
        except InvalidInput as exc:
            raise InvalidInput(f"{label(index)}: {exc.message}") from exc
        ids = prompt.row_ids(row.line)
        if len(ids) > settings.max_row_tokens:
            raise InvalidInput(f"{label(index)}: {len(ids)} tokens; the limit is {settings.max_row_tokens}")
        out.append((row, ids))
    return out


def check_seqs(seqs, count: int, last_seq: int) -> tuple[int, ...]:
    """The caller's sequence numbers for `count` rows: ints, strictly
    increasing, the first greater than `last_seq` (every seq seen so far).

    Raises:
        SeqsBehind: the first is not above `last_seq` (carries it).
        InvalidInput: naming the first number out of order.
    """
    if not isinstance(seqs, (list, tuple)) or len(seqs) != count:
        raise InvalidInput(f"seqs must be a list of {count} sequence numbers, one per row")
    previous = last_seq
    for index, seq in enumerate(seqs):
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise InvalidInput(f"seqs[{index}]: {seq!r} is not an integer")
        if seq <= previous and index == 0:
            raise SeqsBehind(f"seqs[0]: {seq} is not greater than {previous}, the newest seq this session "
                             "has seen (sequence numbers must increase across the session)", previous)
        if seq <= previous:
            raise InvalidInput(f"seqs[{index}]: {seq} is not greater than {previous} "
                               "(sequence numbers must increase across the session)")
        previous = seq
    return tuple(seqs)


def rebuild_entries(prompt: DataPrompt, settings: DataSettings,
                    rows: Iterable) -> tuple[list[RowEntry], list[tuple[int, str]]]:
    """The `(seq, row)` pairs a session is rebuilt from: (entries, refused), oldest first.

    A row the session cannot take (logged before a rule it breaks existed:
    an integer beyond 64 bits, a row grown too long) is refused as a push
    would refuse it, named by its seq in `refused` ((seq, reason) pairs), and
    the rest go on: one bad row in the log must not break the session for good.

    Raises:
        InvalidInput: a pair is malformed or the seqs do not increase (the log itself is wrong).
    """
    pairs = list(rows)
    for index, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise InvalidInput(f"rebuild row {index}: must be a (seq, row) pair")
    seqs = check_seqs([seq for seq, _ in pairs], len(pairs), 0)
    entries, refused = [], []
    for seq, (_, raw) in zip(seqs, pairs):
        try:
            (row, ids), = validate_rows(prompt, settings, [raw], label=lambda _: f"rebuild row seq {seq}")
        except InvalidInput as exc:
            refused.append((seq, exc.message))
            continue
        entries.append(RowEntry(seq, row, ids))
    return entries, refused


def retention_cut(token_counts: Sequence[int], bound: int, keep: int) -> int:
    """Index of the oldest row retention keeps of rows with these token counts
    (oldest first), replaying it row by row: whenever the rows kept pass
    `bound` tokens the oldest leave until at most `keep` remain (the newest
    row always stays).

    Leaving down to `keep` rather than just under `bound` is what makes a
    rebuild pay: a rebuild re-prefills every kept row, so cutting the fewest
    rows would re-prefill the whole region for each new batch (issue 14's
    mixed run: two producers' sessions rebuilt back to back and starved every
    answer), while this rebuilds once per `bound - keep` tokens of new rows.
    The cut is a function of the rows alone, not of how pushes were batched:
    a session rebuilt from its rows keeps the same ones as the live one, and
    replaying from any earlier cut gives the same answer."""
    start, total = 0, 0
    for index, count in enumerate(token_counts):
        total += count
        if total > bound:
            while total > keep and start < index:
                total -= token_counts[start]
                start += 1
    return start


class Ingestion:
    """`DataSession`'s push and ingestion job (its state lives on the session).

    A push validates, tokenizes and buffers on the caller's thread and
    returns at once; the buffer is bounded and drops its *oldest
    unprocessed* rows when full, counted in the ack and in `describe()`.
    Before that, a session whose ingestion is past its lag bound
    (`headstart.data.lag`) refuses a push whole with `IngestionBehind` and a
    retry hint, so a producer faster than the replica meets backpressure
    instead of a growing backlog.
    Every ingestion batch (STREAM) inserts its rows into the working copy,
    extends the cache and sets the data version in one commit on the worker
    thread, so a query's version names exactly the rows it saw.
    """

    def push(self, rows: list[dict], seqs: list[int] | None = None) -> PushAck:
        """Validate and buffer `rows` (each `{"table": name, "values": {column: value}}`);
        returns at once. All or nothing: one bad row rejects the push.

        Args:
            seqs: the rows' sequence numbers, the caller's (strictly increasing,
                the first greater than every seq this session has seen); None:
                the session numbers them after the last one.

        Raises:
            InvalidInput: a row names an unknown table or column, has a value
                of the wrong type or is too long (the message names the row),
                or `seqs` is out of order.
            ResourceExhausted: the rows' cells do not fit the replica's KV
                budget (`headstart.data.budget`); nothing was buffered.
            IngestionBehind: the session is past its lag bound; nothing was
                buffered (retry after its `retry_after_s`).
            SessionClosed: the session is closed; SessionFailed: its ingestion failed.
        """
        self._check_usable()
        if not isinstance(rows, (list, tuple)) or not rows:
            raise InvalidInput("push needs a non-empty list of rows")
        entries = validate_rows(self.prompt, self.settings, rows)
        return self._charge.push(sum(len(ids) for _, ids in entries), lambda: self._accept(entries, seqs))

    def _accept(self, entries, seqs) -> PushAck:
        """Buffer validated rows under their seqs, dropping the oldest unprocessed past the bound."""
        with self._lock:
            self._check_usable()
            self._check_lag()
            if seqs is None:
                seqs = tuple(range(self._last_seq + 1, self._last_seq + 1 + len(entries)))
            else:
                seqs = check_seqs(seqs, len(entries), self._last_seq)
            self._last_seq = seqs[-1]
            self._buffer.extend(RowEntry(seq, row, ids) for seq, (row, ids) in zip(seqs, entries))
            self._lag.pushed(seqs[-1], len(entries))
            dropped = []
            while len(self._buffer) > self.settings.buffer_rows:
                dropped.append(self._buffer.popleft().seq)  # the oldest unprocessed rows go, counted
            if dropped:
                self._lag.handled(dropped[-1])
            self.counts["accepted"] += len(entries)
            self.counts["dropped"] += len(dropped)
            if self._ingest_job is None:
                self._ingest_job = self._enqueue(Call(self._ingest_step, self._ingest_commit), Priority.STREAM,
                                                 "data-ingest", background=True)
            return PushAck(seqs, len(dropped), tuple(dropped), self.counts["dropped"], len(self._buffer))

    def _check_lag(self) -> None:
        """IngestionBehind when the session is past its lag bound (the caller holds the lock)."""
        bound: LagBound = self.lag_bound
        reason = bound.exceeded(self._lag.current())
        if reason is None:
            return
        self.counts["behind_refusals"] += 1
        retry = self._lag.retry_after(bound)
        raise IngestionBehind(f"data session {self.id}: ingestion is {reason}; nothing of this push was kept, "
                              f"retry in {retry:.1f} s", retry)

    def _handled(self, through_seq: int) -> None:
        """Rows up to `through_seq` are handled: their pushes leave the lag, their delays are observed
        (the caller holds the lock)."""
        for delay in self._lag.handled(through_seq):
            if self.lag_histogram is not None:
                self.lag_histogram.observe(delay)

    def _ingest_step(self) -> Row | bool:
        """The next batch's row (worker thread); a failure here fails the session, never silently."""
        try:
            return self._next_batch()
        except Exception as exc:
            self._fail(f"ingestion failed: {type(exc).__name__}: {exc}")
            return False

    def _next_batch(self) -> Row | bool:
        with self._lock:
            if self.state is not DataState.LIVE or not self._buffer:
                self._ingest_job = None
                return False
            # a batch: at most batch_rows rows and one chunk of tokens (at least one row), so the
            # forward a submit may wait behind stays bounded
            batch, tokens = [], 0
            job = self._ingest_job
            limit = self.runtime.limits.chunk_tokens
            if job is not None and job.token_cap is not None:  # answers wait (the scheduler's rule 2d)
                limit = min(limit, job.token_cap)
            while self._buffer and len(batch) < self.settings.batch_rows and (
                    not batch or tokens + len(self._buffer[0].ids) <= limit):
                tokens += len(self._buffer[0].ids)
                batch.append(self._buffer.popleft())
            self._through = batch[-1].seq  # refused rows of the batch are handled with it
        refused = self.copy.rejects([entry.row for entry in batch])
        if refused:  # valid rows the database refuses (a duplicate key): counted, named, never cached
            with self._lock:
                self.counts["refused"] += len(refused)
                self.refusals.extend((batch[i].seq, message) for i, message in refused)
            skip = {i for i, _ in refused}
            batch = [entry for i, entry in enumerate(batch) if i not in skip]
            if not batch:
                with self._lock:
                    self._handled(self._through)
                return True
        ids = [t for entry in batch for t in entry.ids]
        job = self._ingest_job
        self._ingesting = batch
        return Row(self._live, ids, False, lambda: job is not None and job.preempt_requested, runner=self.runner)

    def _ingest_commit(self, row: Row, result: RowResult) -> bool:
        """The batch's one commit: insert into the working copy, record the rows
        in the cache, bump the version, apply retention (worker thread)."""
        batch, self._ingesting = self._ingesting, []
        if result.error is not None:
            # the cache may have grown in some layers: cut it back to the rows it
            # holds; the session fails (the batch's rows never reached the cache)
            self._live.undo_partial_forward()
            with self._lock:
                self.counts["failed"] += len(batch)
            self._fail(f"an ingestion forward failed at seqs {batch[0].seq}..{batch[-1].seq}: "
                       f"{type(result.error).__name__}: {result.error}")
            raise result.error
        if not result.ran:  # it yielded to a more urgent job: the rows are still the oldest unprocessed
            with self._lock:
                self._buffer.extendleft(reversed(batch))
            return True
        version = batch[-1].seq  # the data version: the newest row in the cache
        try:
            self.copy.insert([entry.row for entry in batch], [entry.seq for entry in batch])
        except Exception as exc:  # the copy cannot hold what the cache now holds: stop, loudly (nothing reads it)
            with self._lock:
                self.counts["failed"] += len(batch)
            self._fail(f"inserting seqs {batch[0].seq}..{batch[-1].seq} into the working copy failed: "
                       f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            self._segments.extend(batch)
            self._version = version
            self._handled(self._through)
            self.counts["processed"] += len(batch)
            self.counts["batches"] += 1
            more = bool(self._buffer) and self.state is not DataState.CLOSED
            if not more:
                self._ingest_job = None
        self._retain()
        self._ready.refresh(self)
        lag = self.lag()
        self._announce(VersionEvent(version, len(batch), self.counts["dropped"], len(self._segments),
                                    lag.versions, lag.seconds))
        return more

    def _announce(self, event: VersionEvent) -> None:
        if self.on_version is None:
            return
        try:
            self.on_version(event)
        except Exception:  # a listener's failure must not undo or stop ingestion
            log.exception("data session %s: on_version failed for version %d", self.id, event.version)
