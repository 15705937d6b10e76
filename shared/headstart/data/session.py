"""`DataSession`: a live KV cache of (frozen | sliding | ephemeral) regions on an `EngineRuntime`.

- **frozen**: instructions + schema (`DataPrompt.frozen_ids`), brought from
  the runtime's P0 of the database (its common prefix is reused, the rest
  extended by the catch-up rule) when the session opens.
- **sliding**: the accepted rows, one line each, oldest first, bounded by
  `retention_tokens`.
- **ephemeral**: a query's question and answer. A query extends a
  `KVState.share()` of the live cache (a private tail over the live tensors,
  which are never written in place), decodes, and drops the tail: the same
  as appending to the live cache and cropping back, and ingestion or a
  rebuild swap in between cannot disturb it.

Work runs as jobs on the runtime's forward worker, in the scheduler's
classes: ingestion, rebuild and ready-position steps at STREAM, queries at
SUBMIT, flash evaluations at FLASH. The session is assembled from one file
per job:

- `ingest.py` (`Ingestion`): push, the bounded buffer, ingestion batches,
  sequence numbers; the data version is the seq of the newest row in the
  cache, so a session rebuilt from the same rows (`rows=`) reaches it too.
- `retention_jobs.py` (`RetentionJobs`): `shift` (re-rotate, approximate)
  and `rebuild` (re-prefill in the background and swap, exact).
- `answer.py`: one greedy answer on a snapshot (queries and flash answers).
- `flash_eval.py`: `evaluate`, all registered questions on one version.
- `ready.py`: ready-position logits and the speculative exit (off by default).
- `budget.py`: the session's charge to the runtime's KV budget.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable

from headstart.data.answer import Answer, Snapshot
from headstart.data.budget import DataCharge
from headstart.data.flash_eval import evaluate
from headstart.data.ingest import Ingestion, rebuild_entries, retention_cut
from headstart.data.lag import IngestionLag, Lag, LagBound, LagHistogram
from headstart.data.prompt import DataPrompt
from headstart.data.ready import ReadyLogits, ReadyPosition
from headstart.data.retention import frozen_part
from headstart.data.retention_jobs import RetentionJobs, raise_or
from headstart.data.states import DataState, RetentionState, advance
from headstart.data.types import DataSettings, FlashAnswer, QueryResult, RowEntry, VersionEvent
from headstart.data.workcopy import WorkingCopy
from headstart.engine.requests.catch_up import CatchUp, start_catch_up
from headstart.engine.errors import InvalidInput, SessionClosed, SessionFailed, validate_text
from headstart.engine.kv.state import KVState
from headstart.engine.runner.rows import Row, RowResult
from headstart.engine.sched.jobs import JobWork, Priority
from headstart.eval.extract import extract_sql
from headstart.prompt import common_prefix_len
from headstart.schema.model import SchemaError
from headstart.schema.resolve import resolve_database

log = logging.getLogger(__name__)


class DataSession(Ingestion, RetentionJobs):
    """A data session on `runtime` over the SQLite database `db` (a path or a
    Spider id with its file). Opening waits for the frozen region.

    Args:
        rows: `(seq, {"table": ..., "values": {...}})` pairs to rebuild from
            (a replica that lost the session): all go into the working copy,
            the retained tail into the cache, before the session is LIVE; the
            data version is then the same as the lost session's (no
            `VersionEvent` for it: that version was announced already). Rows
            the lost session dropped from its buffer (`PushAck.dropped_seqs`)
            should be left out, or the rebuilt cache holds rows it never had.
        on_version: called with a `VersionEvent` after each committed
            ingestion batch, on the worker thread: it must not block.
        on_failure: called once with the reason when the session fails
            (`DataState.FAILED`), on the thread that failed it: it must not block.
        lag_histogram: where the delays of its pushes (acknowledged to
            handled) are counted (the replica's, for /metrics); None: nowhere.

    Raises:
        InvalidInput: `db` does not resolve to a SQLite file, or a rebuild row is malformed.
        ResourceExhausted: the session's cells do not fit the replica's KV
            budget, even after evicting idle typing sessions (`headstart.data.budget`).
    """

    def __init__(self, runtime, db: str, settings: DataSettings | None = None,
                 session_id: str | None = None, tenant: str | None = None, rows: Iterable = (),
                 on_version: Callable[[VersionEvent], None] | None = None,
                 on_failure: Callable[[str], None] | None = None, lag_histogram: LagHistogram | None = None):
        self.runtime, self.db, self.tenant, self.on_version = runtime, db, tenant, on_version
        self.on_failure = on_failure
        self.failure: str | None = None  # why the session failed (DataState.FAILED)
        self.settings = settings or DataSettings()
        self.id = session_id or uuid.uuid4().hex
        try:
            resolved = resolve_database(db, spider_dir=runtime.settings.spider_dir)
        except SchemaError as exc:
            raise InvalidInput(str(exc)) from exc
        if resolved.sqlite_path is None:
            raise InvalidInput(f"data sessions need a SQLite database; {db!r} has no file")
        self.runner = runtime.runner
        self.prompt = DataPrompt(runtime.loaded.tokenizer, resolved.schema)
        self.copy = WorkingCopy(resolved.sqlite_path)
        self.frozen_tokens = len(self.prompt.frozen_ids)
        self._lock = threading.Lock()
        self.state, self.retention_state = DataState.OPENING, RetentionState.STEADY
        self._buffer: deque[RowEntry] = deque()
        self._segments: list[RowEntry] = []  # rows in the live cache, oldest first (worker thread)
        self._last_seq, self._version = 0, 0  # every seq seen so far is <= _last_seq
        self._ingest_job = self._rebuild_job = None
        self._ingesting: list[RowEntry] = []  # the batch of the ingestion row in flight (worker thread)
        self._through = 0  # the newest seq of that batch, refused rows included
        # acknowledged pushes not handled yet, and the bound past which a push is refused (headstart.data.lag)
        self._lag = IngestionLag()
        self.lag_bound = LagBound(runtime.settings.data_max_lag_versions, runtime.settings.data_max_lag_s)
        self.lag_histogram = lag_histogram
        self._rebuild_kv: KVState | None = None
        self._rebuilding: tuple[CatchUp, float] | None = None  # the rebuild row in flight and its start
        self._rebuild_cutoff = 0
        self.counts = dict(accepted=0, dropped=0, refused=0, failed=0, processed=0, retired=0, batches=0, shifts=0,
                           rebuilds=0, queries=0, rebuild_tokens=0, rebuild_failures=0, restored=0,
                           flash_evaluations=0, flash_questions=0, ready_exits=0, ready_refreshes=0,
                           behind_refusals=0)
        self._ready = ReadyLogits()
        self._answers: set[Answer] = set()  # answers in flight (their tails count in the cell budget)
        self.refusals: deque[tuple[int, str]] = deque(maxlen=32)  # the latest (seq, reason) refused
        self.retention_seconds = 0.0  # worker time spent shifting or re-prefilling (benchmarks)
        self._charge = DataCharge(self)  # the cell budget (headstart.data.budget)
        try:
            row_ids = self._restore(*rebuild_entries(self.prompt, self.settings, rows))
            self._charge.admit(self.frozen_tokens + len(row_ids))  # before any forward: refused, it cost nothing
            self._live = self._open(row_ids)
        except BaseException:
            self.state = advance(self.state, DataState.CLOSED)
            self._charge.release()
            self.copy.close()
            raise
        self._charge.opened()
        self.state = advance(self.state, DataState.LIVE)
        self._ready.refresh(self)

    # -- opening: the frozen region from P0 ----------------------------------------

    def _restore(self, entries: list[RowEntry], invalid: list[tuple[int, str]]) -> list[int]:
        """Rebuild rows: all into the working copy (each under its seq), the
        retained tail into `_segments`; returns those rows' tokens (opening).
        Rows the session cannot take (`invalid`: (seq, reason)) and rows the
        database refuses are refused as an ingestion batch refuses them:
        counted and named in `last_refusals`, the rest go on."""
        refused = self.copy.rejects([entry.row for entry in entries]) if entries else []
        skip = {i for i, _ in refused}
        kept = [entry for i, entry in enumerate(entries) if i not in skip]
        if kept:
            self.copy.insert([entry.row for entry in kept], [entry.seq for entry in kept])
        start = retention_cut([len(entry.ids) for entry in kept], *self.settings.retention_window)
        self._segments = kept[start:]
        seqs = [entry.seq for entry in entries] + [seq for seq, _ in invalid]
        self._last_seq, self._version = max(seqs, default=0), kept[-1].seq if kept else 0
        self.refusals.extend(sorted(invalid + [(entries[i].seq, message) for i, message in refused]))
        self.counts.update(accepted=len(seqs), refused=len(refused) + len(invalid), processed=len(kept),
                           retired=start, restored=len(seqs))
        return [t for entry in self._segments for t in entry.ids]

    def _open(self, row_ids: list[int]) -> KVState:
        """The live cache: the frozen region (from P0) and `row_ids` (a rebuild's rows)."""
        base = self.runtime.base_state(self.runtime.prompt_for(self.db))
        opening = _OpenLiveCache(self.runner, base, self.prompt.frozen_ids + row_ids, self.runtime.limits.chunk_tokens)
        self._enqueue(opening, Priority.STREAM, "data-open").wait()
        return opening.kv

    # -- queries ----------------------------------------------------------------------

    def query(self, question: str, max_new_tokens: int = 64, timeout: float | None = None,
              allow_speculative: bool = True) -> QueryResult:
        """Answer `question` on the live cache at SUBMIT priority (greedy), at the
        data version current when its first step runs.

        With `DataSettings.ready_exit_gap` set (and `allow_speculative`), a
        query may instead be answered at once from the ready-position logits
        of the current version when their top token is a fast answer
        (`speculative=True`, one word, no SQL, no forward; see
        `headstart.data.ready`).

        Raises:
            InvalidInput: the question is empty or too long, or max_new_tokens < 1.
        """
        question = self._check_question(question, max_new_tokens)
        started = time.perf_counter()
        if allow_speculative:
            quick = self._ready.exit(self, started)
            if quick is not None:
                return quick
        answer = Answer(self.runner, self.prompt.question_ids(question), max_new_tokens, self.runtime.stop_ids)
        query = _Query(self, answer)
        with self._lock:
            self._answers.add(answer)
        try:
            self._enqueue(query, Priority.SUBMIT, "data-query").wait(timeout)
        finally:
            with self._lock:
                self._answers.discard(answer)
                self.counts["queries"] += 1
        snap, text = query.snapshot, self.prompt.decode(answer.tokens)
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
        self._check_usable()
        return question

    def _check_usable(self) -> None:
        """Raise SessionClosed or SessionFailed unless the session takes calls (any thread)."""
        if self.state is DataState.CLOSED:
            raise SessionClosed(f"data session {self.id} is closed")
        if self.state is DataState.FAILED:
            raise SessionFailed(f"data session {self.id} failed: {self.failure} (close it and open another)")

    def _fail(self, reason: str) -> None:
        """Move to FAILED (once): drop the buffer, stop ingestion, tell `on_failure` (never silently)."""
        with self._lock:
            if self.state is not DataState.LIVE:
                return
            self.state = advance(self.state, DataState.FAILED)
            self.failure = reason
            self.counts["failed"] += len(self._buffer)
            self._buffer.clear()
            self._lag.clear()
            self._ingest_job = None
        log.error("data session %s failed: %s", self.id, reason)
        if self.on_failure is not None:
            try:
                self.on_failure(reason)
            except Exception:  # a listener's failure must not hide the session's
                log.exception("data session %s: on_failure failed", self.id)

    def _snapshot(self) -> Snapshot:
        """The live cache as one data version (worker thread)."""
        with self._lock:
            return Snapshot(self._live.share(), self._version, len(self._segments), self._live.num_tokens)

    def execute(self, sql: str, version: int) -> tuple[list[str], list[tuple]]:
        """Run `sql` read-only on the working copy as of data `version` (a query's).

        Raises:
            InvalidInput: `version` is not one this session has had; SqlError: the SQL fails.
        """
        self._check_usable()
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= self._version:
            raise InvalidInput(f"data version {version!r} is not in 0..{self._version}")
        return self.copy.execute(sql, version)

    # -- state --------------------------------------------------------------------------

    @property
    def data_version(self) -> int:
        return self._version

    def lag(self) -> Lag:
        """How far the cache is behind the acknowledged pushes now (`headstart.data.lag`)."""
        with self._lock:
            return self._lag.current()

    def ready_position(self) -> ReadyPosition | None:
        """The ready-position logits of the current version, when kept (`headstart.data.ready`)."""
        return self._ready.usable(self)

    def context_ids(self) -> list[int]:
        """The tokens the live cache stands for: frozen + the retained rows (what
        a cold prefill of a query's prompt starts with)."""
        with self._lock:
            return self.prompt.frozen_ids + [t for e in self._segments for t in e.ids]

    def describe(self) -> dict:
        """The session's state and counters; kv_bytes / kv_charged_bytes: its
        cells now and as admission counts them (`headstart.data.budget`);
        lag_versions / lag_rows / lag_seconds: acknowledged pushes not yet
        handled, their rows, the oldest one's age (`headstart.data.lag`)."""
        kv_bytes, charged = self._charge.kv_bytes(), self._charge.charged_bytes()
        with self._lock:
            return dict(id=self.id, db=self.db, tenant=self.tenant, state=self.state.value, failure=self.failure,
                        retention=self.settings.retention, retention_state=self.retention_state.value,
                        data_version=self._version, frozen_tokens=self.frozen_tokens,
                        sliding_tokens=self.sliding_tokens, retention_tokens=self.settings.retention_tokens,
                        rows_in_cache=len(self._segments), buffered=len(self._buffer),
                        cache_tokens=self._live.num_tokens, retention_ms=self.retention_seconds * 1000,
                        kv_bytes=kv_bytes, kv_charged_bytes=charged,
                        last_refusals=list(self.refusals), **self._lag.current().as_dict(),
                        **self.counts)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Block until the buffer is ingested, no rebuild is in flight and the
        ready position is refreshed (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                jobs = [j for j in (self._ingest_job, self._rebuild_job, self._ready.job)
                        if j is not None and not j.done.is_set()]
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
            self._lag.clear()
        self._charge.release()
        # on the worker: no ingestion commit can be writing the copy meanwhile
        self.runtime.worker.run_sync(self.copy.close, Priority.SUBMIT, f"data-close:{self.id}")

    def _enqueue(self, step, priority: Priority, name: str, background: bool = False):
        return self.runtime.worker.enqueue(step, priority, f"{name}:{self.id}", tenant=self.tenant,
                                           background=background)


class _OpenLiveCache(JobWork):
    """The job that opens a live cache: from P0's frozen part to `target` by the
    catch-up rule, a chunk per step (worker thread); the cache is `kv` after."""

    def __init__(self, runner, base: KVState, target: list[int], chunk_tokens: int):
        self.runner, self.base, self.target, self.chunk_tokens = runner, base, target, chunk_tokens
        self.kv: KVState | None = None

    def step(self) -> Row | bool:
        if self.kv is None:
            base = self.base
            self.kv = frozen_part(base, common_prefix_len(base.ids, self.target)) if base.cache is not None \
                else KVState()
        if self.kv.ids == self.target:
            return False
        return start_catch_up(self.runner, self.kv, self.target, self.chunk_tokens, False).row

    def commit(self, row: Row, result: RowResult) -> bool:
        return raise_or(result, True)


class _Query(JobWork):
    """A query's job: its answer's rows on a snapshot taken at its first step."""

    def __init__(self, session: DataSession, answer: Answer):
        self.session, self.answer = session, answer
        self.snapshot: Snapshot | None = None

    def step(self) -> Row:
        if self.snapshot is None:
            self.snapshot = self.session._snapshot()
            self.answer.start(self.snapshot)
        return self.answer.row()

    def commit(self, row: Row, result: RowResult) -> bool:
        return self.answer.commit(row, result)
