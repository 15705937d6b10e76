"""`DataSession`: a live KV cache of (frozen | sliding | ephemeral) regions on an `EngineRuntime`.

- **frozen**: instructions + schema (`DataPrompt.frozen_ids`), brought from
  the runtime's P0 of the database (its common prefix is reused, the rest
  extended by the one commit rule) when the session opens.
- **sliding**: the accepted rows, one line each, oldest first, bounded by
  `retention_tokens`.
- **ephemeral**: a query's question and answer. A query extends a
  `KVState.share()` of the live cache (a private tail over the live tensors,
  which are never written in place), decodes, and drops the tail: the same
  as appending to the live cache and cropping back, and ingestion or a
  rebuild swap in between cannot disturb it.

Work runs as jobs on the runtime's forward worker, in the scheduler's
classes: ingestion and rebuild steps at STREAM, queries at SUBMIT. A
push validates, tokenizes and buffers on the caller's thread and returns at
once; the buffer is bounded and drops its *oldest unprocessed* rows when
full, counted in the ack and in `describe()`. Every ingestion batch inserts
its rows into the working copy, extends the cache and bumps the data version
in one commit on the worker thread, so a query's version names exactly the
rows it saw.

Retention when the sliding region passes its bound: `shift` drops the oldest
rows' entries and re-rotates the rest (no recompute, approximate), `rebuild`
re-prefills frozen + retained rows in the background and swaps (exact).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable

from headstart.data.answer import Answer, Snapshot
from headstart.data.flash_eval import evaluate
from headstart.data.ingest import check_seqs, rebuild_entries, retained_start, validate_rows
from headstart.data.prompt import DataPrompt
from headstart.data.ready import ReadyLogits, ReadyPosition
from headstart.data.retention import frozen_part, shift_out
from headstart.data.states import DataState, RetentionState, advance
from headstart.data.types import DataSettings, FlashAnswer, PushAck, QueryResult, RowEntry, VersionEvent
from headstart.data.workcopy import WorkingCopy
from headstart.engine.commit import start_commit
from headstart.engine.errors import InvalidInput, SessionClosed, validate_text
from headstart.engine.kv import KVState, truncate_layers
from headstart.engine.scheduler_types import Priority
from headstart.engine.steps import Row, RowResult
from headstart.eval.extract import extract_sql
from headstart.prompt import common_prefix_len
from headstart.schema.model import SchemaError
from headstart.schema.resolve import resolve_database

log = logging.getLogger(__name__)


class DataSession:
    """A data session on `runtime` over the SQLite database `db` (a path or a
    Spider id with its file). Opening waits for the frozen region.

    Args:
        rows: `(seq, {"table": ..., "values": {...}})` pairs to rebuild from
            (a replica that lost the session): all go into the working copy,
            the retained tail into the cache, before the session is LIVE; the
            data version is then the same as the lost session's.
        on_version: called with a `VersionEvent` after each committed
            ingestion batch, on the worker thread: it must not block.

    Raises:
        InvalidInput: `db` does not resolve to a SQLite file, or a rebuild row is malformed.
    """

    def __init__(self, runtime, db: str, settings: DataSettings | None = None,
                 session_id: str | None = None, tenant: str | None = None, rows: Iterable = (),
                 on_version: Callable[[VersionEvent], None] | None = None):
        self.runtime, self.db, self.tenant, self.on_version = runtime, db, tenant, on_version
        self.settings = settings or DataSettings()
        self.id = session_id or uuid.uuid4().hex
        try:
            resolved = resolve_database(db, spider_dir=runtime.settings.spider_dir)
        except SchemaError as exc:
            raise InvalidInput(str(exc)) from exc
        if resolved.sqlite_path is None:
            raise InvalidInput(f"data sessions need a SQLite database; {db!r} has no file")
        self.model = runtime.loaded.model
        self.prompt = DataPrompt(runtime.loaded.tokenizer, resolved.schema)
        self.copy = WorkingCopy(resolved.sqlite_path)
        self.frozen_tokens = len(self.prompt.frozen_ids)
        self._lock = threading.Lock()
        self.state, self.retention_state = DataState.OPENING, RetentionState.STEADY
        self._buffer: deque[RowEntry] = deque()
        self._segments: list[RowEntry] = []  # rows in the live cache, oldest first (worker thread)
        self._last_seq, self._version = 0, 0  # every seq seen so far is <= _last_seq
        self._ingest_job = self._rebuild_job = None
        self._rebuild_kv: KVState | None = None
        self._rebuild_cutoff = 0
        self.counts = dict(accepted=0, dropped=0, refused=0, failed=0, processed=0, retired=0, batches=0, shifts=0, rebuilds=0,
                           queries=0, rebuild_tokens=0, rebuild_failures=0, restored=0,
                           flash_evaluations=0, flash_questions=0, ready_exits=0, ready_refreshes=0)
        self._ready = ReadyLogits()
        self._answers: set[Answer] = set()  # answers in flight (their tails count in the cell budget)
        self.refusals: deque[tuple[int, str]] = deque(maxlen=32)  # the latest (seq, reason) refused
        self.retention_seconds = 0.0  # worker time spent shifting or re-prefilling (benchmarks)
        try:
            self._live = self._open(self._restore(rebuild_entries(self.prompt, self.settings, rows)))
        except BaseException:
            self.state = advance(self.state, DataState.CLOSED)
            self.copy.close()
            raise
        self.state = advance(self.state, DataState.LIVE)
        self._ready.refresh(self)

    # -- opening: the frozen region from P0 ----------------------------------------

    def _restore(self, entries: list[RowEntry]) -> list[int]:
        """Rebuild rows: all into the working copy (each under its seq), the
        retained tail into `_segments`; returns those rows' tokens (opening)."""
        if not entries:
            return []
        refused = self.copy.rejects([entry.row for entry in entries])
        skip = {i for i, _ in refused}
        kept = [entry for i, entry in enumerate(entries) if i not in skip]
        self.copy.insert([entry.row for entry in kept], [entry.seq for entry in kept])
        start = retained_start(kept, self.settings.retention_tokens)
        self._segments = kept[start:]
        self._last_seq, self._version = entries[-1].seq, kept[-1].seq if kept else 0
        self.refusals.extend((entries[i].seq, message) for i, message in refused)
        self.counts.update(accepted=len(entries), refused=len(refused), processed=len(kept), retired=start,
                           restored=len(entries))
        return [t for entry in self._segments for t in entry.ids]

    def _open(self, row_ids: list[int]) -> KVState:
        """The live cache: the frozen region (from P0) and `row_ids` (a rebuild's rows)."""
        base = self.runtime.base_state(self.runtime.prompt_for(self.db))
        target = self.prompt.frozen_ids + row_ids
        holder: list[KVState] = []

        def step():
            if not holder:
                holder.append(frozen_part(base, common_prefix_len(base.ids, target)) if base.cache is not None
                              else KVState())
            kv = holder[0]
            if kv.ids == target:
                return False
            return start_commit(self.model, kv, target, self.runtime.limits.chunk_tokens, False, None,
                                lambda _c, result: _raise_or(result, True)).row

        self._enqueue(step, Priority.STREAM, "data-open").wait()
        return holder[0]

    # -- push and ingestion --------------------------------------------------------

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
            SessionClosed: the session is closed.
        """
        if not isinstance(rows, (list, tuple)) or not rows:
            raise InvalidInput("push needs a non-empty list of rows")
        entries = validate_rows(self.prompt, self.settings, rows)
        with self._lock:
            if self.state is DataState.CLOSED:
                raise SessionClosed(f"data session {self.id} is closed")
            if seqs is None:
                seqs = tuple(range(self._last_seq + 1, self._last_seq + 1 + len(entries)))
            else:
                seqs = check_seqs(seqs, len(entries), self._last_seq)
            self._last_seq = seqs[-1]
            self._buffer.extend(RowEntry(seq, row, ids) for seq, (row, ids) in zip(seqs, entries))
            dropped = []
            while len(self._buffer) > self.settings.buffer_rows:
                dropped.append(self._buffer.popleft().seq)  # the oldest unprocessed rows go, counted
            self.counts["accepted"] += len(entries)
            self.counts["dropped"] += len(dropped)
            if self._ingest_job is None:
                self._ingest_job = self._enqueue(self._ingest_step, Priority.STREAM, "data-ingest")
            return PushAck(seqs, len(dropped), tuple(dropped), self.counts["dropped"], len(self._buffer))

    def _ingest_step(self) -> Row | bool:
        with self._lock:
            if self.state is DataState.CLOSED or not self._buffer:
                self._ingest_job = None
                return False
            # a batch: at most batch_rows rows and one chunk of tokens (at least one row), so the
            # forward a submit may wait behind stays bounded
            batch, tokens = [], 0
            while self._buffer and len(batch) < self.settings.batch_rows and (
                    not batch or tokens + len(self._buffer[0].ids) <= self.runtime.limits.chunk_tokens):
                tokens += len(self._buffer[0].ids)
                batch.append(self._buffer.popleft())
        refused = self.copy.rejects([entry.row for entry in batch])
        if refused:  # valid rows the database refuses (a duplicate key): counted, named, never cached
            with self._lock:
                self.counts["refused"] += len(refused)
                self.refusals.extend((batch[i].seq, message) for i, message in refused)
            skip = {i for i, _ in refused}
            batch = [entry for i, entry in enumerate(batch) if i not in skip]
            if not batch:
                return True
        ids = [t for entry in batch for t in entry.ids]
        job = self._ingest_job
        return Row(self.model, self._live, ids, False, lambda: job is not None and job.preempt_requested,
                   lambda result: self._ingest_commit(batch, result))

    def _ingest_commit(self, batch: list[RowEntry], result: RowResult) -> bool:
        """The batch's one commit: insert into the working copy, record the rows
        in the cache, bump the version, apply retention (worker thread)."""
        if result.error is not None:
            # the cache may have grown in some layers: cut it back to the rows it
            # holds; the batch's rows are lost, counted as failed (never silently)
            truncate_layers(self._live.cache, self._live.num_tokens)
            with self._lock:
                self.counts["failed"] += len(batch)
                self._ingest_job = None
                if self._buffer and self.state is not DataState.CLOSED:  # the rows behind it still go in
                    self._ingest_job = self._enqueue(self._ingest_step, Priority.STREAM, "data-ingest")
            raise result.error
        if not result.ran:  # it yielded to a more urgent job: the rows are still the oldest unprocessed
            with self._lock:
                self._buffer.extendleft(reversed(batch))
            return True
        version = batch[-1].seq  # the data version: the newest row in the cache
        self.copy.insert([entry.row for entry in batch], [entry.seq for entry in batch])
        with self._lock:
            self._segments.extend(batch)
            self._version = version
            self.counts["processed"] += len(batch)
            self.counts["batches"] += 1
            more = bool(self._buffer) and self.state is not DataState.CLOSED
            if not more:
                self._ingest_job = None
        self._retain()
        self._ready.refresh(self)
        self._announce(VersionEvent(version, len(batch), self.counts["dropped"], len(self._segments)))
        return more

    def _announce(self, event: VersionEvent) -> None:
        if self.on_version is None:
            return
        try:
            self.on_version(event)
        except Exception:  # a listener's failure must not undo or stop ingestion
            log.exception("data session %s: on_version failed for version %d", self.id, event.version)

    # -- retention --------------------------------------------------------------------

    @property
    def sliding_tokens(self) -> int:
        return sum(len(entry.ids) for entry in self._segments)

    def _over(self) -> tuple[int, int]:
        """How many oldest rows (and their tokens) must leave to fit the bound."""
        excess, rows, tokens = self.sliding_tokens - self.settings.retention_tokens, 0, 0
        while tokens < excess:
            tokens += len(self._segments[rows].ids)
            rows += 1
        return rows, tokens

    def _retain(self) -> None:
        rows, tokens = self._over()
        if not rows:
            return
        if self.settings.retention == "shift":
            started = time.perf_counter()
            self._live = shift_out(self.model, self._live, self.frozen_tokens, tokens)
            self.retention_seconds += time.perf_counter() - started
            with self._lock:
                del self._segments[:rows]
                self.counts["retired"] += rows
                self.counts["shifts"] += 1
        elif self.retention_state is RetentionState.STEADY:
            self.retention_state = advance(self.retention_state, RetentionState.REBUILDING)
            self._rebuild_cutoff = self._segments[rows - 1].seq
            self._rebuild_kv = None
            self._rebuild_job = self._enqueue(self._rebuild_step, Priority.STREAM, "data-rebuild")

    def _retained_target(self) -> list[int]:
        kept = [t for e in self._segments if e.seq > self._rebuild_cutoff for t in e.ids]
        return self.prompt.frozen_ids + kept

    def _rebuild_step(self) -> Row | bool:
        """One chunk of the rebuild; rows ingested meanwhile join its target; when
        it holds the whole target the live cache is swapped (worker thread)."""
        if self.state is DataState.CLOSED:
            return False
        if self._rebuild_kv is None:
            self._rebuild_kv = frozen_part(self._live, self.frozen_tokens)
        target = self._retained_target()
        if self._rebuild_kv.ids == target:
            self._swap()
            return False
        job, started = self._rebuild_job, time.perf_counter()

        def then(commit, result: RowResult) -> bool:
            # the row's forward ran between this step and its commit, on this thread
            self.retention_seconds += time.perf_counter() - started
            self.counts["rebuild_tokens"] += len(commit.step.chunk) if result.ran else 0
            if result.error is not None:  # give up this rebuild (the live cache is intact); the next batch retries
                self._rebuild_kv = None
                self.retention_state = advance(self.retention_state, RetentionState.STEADY)
                self.counts["rebuild_failures"] += 1
            return _raise_or(result, True)

        return start_commit(self.model, self._rebuild_kv, target, self.runtime.limits.chunk_tokens, False,
                            lambda: job is not None and job.preempt_requested, then).row

    def _swap(self) -> None:
        with self._lock:
            kept = [e for e in self._segments if e.seq > self._rebuild_cutoff]
            self.counts["retired"] += len(self._segments) - len(kept)
            self.counts["rebuilds"] += 1
            self._segments, self._live, self._rebuild_kv = kept, self._rebuild_kv, None
            self.retention_state = advance(self.retention_state, RetentionState.STEADY)
        self._ready.invalidate()  # same version, another cache
        self._retain()  # rows that arrived during the rebuild may be over the bound again
        self._ready.refresh(self)

    # -- queries ----------------------------------------------------------------------

    def query(self, question: str, max_new_tokens: int = 64, timeout: float | None = None,
              allow_speculative: bool = True) -> QueryResult:
        """Answer `question` on the live cache at SUBMIT priority (greedy), at the
        data version current when its first step runs.

        With `DataSettings.ready_exit_gap` set (and `allow_speculative`), a
        query may instead be answered at once from the ready-position logits
        of the current version (`speculative=True`, one token, no forward;
        see `headstart.data.ready`).

        Raises:
            InvalidInput: the question is empty or too long, or max_new_tokens < 1.
        """
        question = self._check_question(question, max_new_tokens)
        started = time.perf_counter()
        if allow_speculative:
            quick = self._ready.exit(self, started)
            if quick is not None:
                return quick
        answer = Answer(self.model, self.prompt.question_ids(question), max_new_tokens, self.runtime.stop_ids)
        held: list[Snapshot] = []

        def step() -> Row:
            if not held:
                held.append(self._snapshot())
                answer.start(held[0])
            return answer.row()

        with self._lock:
            self._answers.add(answer)
        try:
            self._enqueue(step, Priority.SUBMIT, "data-query").wait(timeout)
        finally:
            with self._lock:
                self._answers.discard(answer)
                self.counts["queries"] += 1
        snap, text = held[0], self.prompt.decode(answer.tokens)
        return QueryResult(text, extract_sql(text), snap.version, snap.rows, snap.context, answer.tokens,
                           answer.first_logits, time.perf_counter() - started)

    def evaluate(self, questions: list[str], max_new_tokens: int = 64,
                 timeout: float | None = None) -> list[FlashAnswer]:
        """Answer registered questions at FLASH priority, all on one snapshot
        of the live cache (one data version), each with its SQL executed on
        the working copy at that version. See `headstart.data.flash_eval`."""
        return evaluate(self, questions, max_new_tokens, timeout)

    def _check_question(self, question, max_new_tokens: int) -> str:
        question = validate_text(question, self.settings.max_question_chars)
        if not question.strip() or isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 1:
            raise InvalidInput("a query needs a non-empty question and max_new_tokens >= 1")
        if self.state is DataState.CLOSED:
            raise SessionClosed(f"data session {self.id} is closed")
        return question

    def _snapshot(self) -> Snapshot:
        """The live cache as one data version (worker thread)."""
        with self._lock:
            return Snapshot(self._live.share(), self._version, len(self._segments), self._live.num_tokens)

    def execute(self, sql: str, version: int) -> tuple[list[str], list[tuple]]:
        """Run `sql` read-only on the working copy as of data `version` (a query's).

        Raises:
            InvalidInput: `version` is not one this session has had; SqlError: the SQL fails.
        """
        if self.state is DataState.CLOSED:
            raise SessionClosed(f"data session {self.id} is closed")
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= self._version:
            raise InvalidInput(f"data version {version!r} is not in 0..{self._version}")
        return self.copy.execute(sql, version)

    # -- state --------------------------------------------------------------------------

    @property
    def data_version(self) -> int:
        return self._version

    def ready_position(self) -> ReadyPosition | None:
        """The ready-position logits of the current version, when kept (`headstart.data.ready`)."""
        return self._ready.usable(self)

    def context_ids(self) -> list[int]:
        """The tokens the live cache stands for: frozen + the retained rows (what
        a cold prefill of a query's prompt starts with)."""
        with self._lock:
            return self.prompt.frozen_ids + [t for e in self._segments for t in e.ids]

    def describe(self) -> dict:
        with self._lock:
            return dict(id=self.id, db=self.db, tenant=self.tenant, state=self.state.value,
                        retention=self.settings.retention, retention_state=self.retention_state.value,
                        data_version=self._version, frozen_tokens=self.frozen_tokens,
                        sliding_tokens=self.sliding_tokens, retention_tokens=self.settings.retention_tokens,
                        rows_in_cache=len(self._segments), buffered=len(self._buffer),
                        cache_tokens=self._live.num_tokens, retention_ms=self.retention_seconds * 1000,
                        kv_bytes=self._live.nbytes() + (self._rebuild_kv.nbytes() if self._rebuild_kv else 0),
                        last_refusals=list(self.refusals),
                        **self.counts)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Block until the buffer is ingested, no rebuild is in flight and the
        ready position is refreshed (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                jobs = [j for j in (self._ingest_job, self._rebuild_job, self._ready.job) if j is not None and not j.done.is_set()]
                idle = not self._buffer and not jobs and self.retention_state is RetentionState.STEADY
            if idle:
                return
            for job in jobs:
                job.wait(max(0.0, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                raise TimeoutError(f"data session {self.id} did not become idle in {timeout} s")
            time.sleep(0.001)

    def close(self) -> None:
        """Close: drop the buffer, stop its jobs, remove the working copy."""
        with self._lock:
            if self.state is DataState.CLOSED:
                return
            self.state = advance(self.state, DataState.CLOSED)
            self._buffer.clear()
        # on the worker: no ingestion commit can be writing the copy meanwhile
        self.runtime.worker.run_sync(self.copy.close, Priority.SUBMIT, f"data-close:{self.id}")

    def _enqueue(self, step, priority: Priority, name: str):
        return self.runtime.worker.enqueue(step, priority, f"{name}:{self.id}", tenant=self.tenant)


def _raise_or(result: RowResult, value: bool) -> bool:
    if result.error is not None:
        raise result.error
    return value
