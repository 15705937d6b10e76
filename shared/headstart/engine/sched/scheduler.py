"""The scheduler: the one place that decides what the forward worker runs next.

The worker's loop is `plan = scheduler.schedule(now)`, the plan's rows run
and each job commits, then `scheduler.postprocess(plan, outcomes, now)`. The
scheduler owns the waiting jobs and every job's `JobState` (WAITING ->
RUNNING -> WAITING | FINISHED, changed only here). Its rules, each
explained where it is applied and in docs/scheduler.md:

1. Classes: FLASH > SUBMIT > POOL > STREAM > DEFERRED_DECODE > BACKGROUND > IDLE (`rank`).
2. Decode deferral: a submit's or completion's decode step waits behind typing
   for `decode_defer_s` (`deferred`); 2b. streaming answers ride every forward
   they may share (`_group`); 2c. typing rows beside them share `stream_tokens`
   (`_idle_typing_waits`, `_capped`); 2d. background work waits for answers (`rank`);
   2e. sampled candidates never ride with answers (`_group`).
3. Shortest prefill first within a class (the jobs' `order_key`).
4. Batch scopes and the token budget form a group (`batch_kind`, `_group`).
5. Preemption of running steps by new, more urgent jobs (`preempts`).
6. Fairness across tenants and 7. reranking of table-cache completions
   (`sched.ordering`).

Hints are read on the worker thread between steps (no step of that job runs
then), so they need no lock and no fallback: a hint that raises fails its
own job (`Plan.failed`) instead of silently reordering work.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from headstart.config import default
from headstart.engine.sched import ordering
from headstart.engine.errors import Cancelled
from headstart.engine.sched.jobs import (
    BatchKind, BatchScope, Job, JobState, Plan, PlannedJob, Priority, Rank, StepOutcome,
)


class Scheduler:
    """Waiting jobs and the rules above. Not thread-safe: the worker calls it
    under its own lock."""

    # the defaults are the settings' (config.default), so a Scheduler() schedules as a replica does
    def __init__(self, max_batch_rows: int = default("max_batch_rows"),
                 max_batch_tokens: int = default("max_batch_tokens"),
                 batch_scope: str | BatchScope = default("batch_scope"),
                 decode_defer_s: float = default("decode_defer_ms") / 1000.0,
                 rerank_max_delay: int = default("table_rerank_max_delay"),
                 stream_tokens: int = default("stream_typing_tokens"),
                 resident_table_blocks: Callable[[], frozenset[str]] = frozenset):
        if max_batch_rows < 1 or max_batch_tokens < 1 or stream_tokens < 1:
            raise ValueError("max_batch_rows, max_batch_tokens and stream_tokens must be >= 1")
        if rerank_max_delay < 0:
            raise ValueError("rerank_max_delay must be >= 0")
        self.max_batch_rows = max_batch_rows
        self.max_batch_tokens = max_batch_tokens
        self.batch_scope = BatchScope.parse(batch_scope)
        self.decode_defer_s = decode_defer_s
        self.stream_tokens = stream_tokens
        self._waiting: list[Job] = []
        self._arrivals = itertools.count()
        # rule 6: tenant -> stamp of its last service; rule 7: the bound, and where blocks are
        self._served: dict[str | None, int] = {}
        self._services = itertools.count()
        self.rerank_max_delay = rerank_max_delay
        # rule 7's anchor before any completion started: the table blocks on the device (the prefix source's)
        self.resident_table_blocks = resident_table_blocks
        self._last_table_blocks: frozenset[str] | None = None

    # -- queue -------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def waiting_job_names(self) -> list[str]:
        """The names of the waiting jobs (a snapshot, for tests and diagnostics)."""
        return [job.name for job in list(self._waiting)]

    @property
    def num_tenants_served(self) -> int:
        """Tenants rule 6 remembers (one entry each, ever served)."""
        return len(self._served)

    def add(self, job: Job, now: float) -> None:
        """Queue `job` (new, or again after a step that left more to do)."""
        job.state = JobState.WAITING
        job.arrival = next(self._arrivals)
        job.queued_at = now
        job.decode_step = bool(job.work.decoding())
        self._waiting.append(job)

    def withdraw(self, job: Job) -> bool:
        """Take one waiting job off the queue, finished as cancelled; False when it is not
        waiting (running, or already finished)."""
        if job.state is not JobState.WAITING or not any(j is job for j in self._waiting):
            return False
        self._waiting = [j for j in self._waiting if j is not job]
        self._finish(job, Cancelled(f"job {job.name!r} was cancelled"))
        return True

    def drain(self) -> list[Job]:
        """Take every waiting job off the queue (shutdown), marked FINISHED."""
        jobs, self._waiting = self._waiting, []
        for job in jobs:
            job.state = JobState.FINISHED
        return jobs

    # -- decide ------------------------------------------------------------------

    def schedule(self, now: float) -> Plan:
        """Pop the next iteration's rows off the queue (module doc, rules 1-4)."""
        dropped = tuple(job for job in self._waiting if job.cancelled)
        ranked, failed = [], []
        for job in self._waiting:
            if job.cancelled:
                continue
            try:
                ranked.append((self.rank(job, now), job))
            except Exception as exc:  # the hint's own job fails, visibly; nothing is reordered
                failed.append((job, exc))
        riding: dict[int, int] = {}  # id(job) -> its riding hint, read once per iteration
        ranked = self._idle_typing_waits(self.order(ranked), failed, riding)
        rows, kind = self._group(ranked, failed, riding)
        taken = {id(job) for job in dropped} | {id(row.job) for row in rows} | {id(job) for job, _ in failed}
        self._waiting = [job for job in self._waiting if id(job) not in taken]
        self._note_service(rows)
        for row in rows:
            row.job.state = JobState.RUNNING
            row.job.running_class = row.rank.cls
        for job in dropped:
            self._finish(job, Cancelled(f"job {job.name!r} was cancelled"))
        for job, exc in failed:
            self._finish(job, exc)
        deferred = tuple(job for rank, job in ranked if rank.cls == Priority.DEFERRED_DECODE)
        return Plan(tuple(rows), kind if len(rows) > 1 else None, dropped, tuple(failed), deferred)

    def _idle_typing_waits(self, ranked: list[tuple[Rank, Job]], failed: list,
                           riding: dict[int, int]) -> list[tuple[Rank, Job]]:
        """Rule 2c: while answers stream and typing rows would ride with them,
        a typing job with nothing to take riding (`JobWork.riding_cost` 0)
        waits, even where it would head the group: its step would be a row
        of no tokens (and a progress event) in every forward. Notes each
        hint it reads in `riding`, for `_group` (whenever `_group` caps a
        typing row, this has read every hint: a typing row is capped only
        beside a streaming answer it may ride with; a job without the hint
        is capped at its `cost`)."""
        rides = (self.max_batch_rows > 1 and self.batch_scope in (BatchScope.TYPING_WITH_DECODE, BatchScope.ALL)
                 and any(self.streaming(job) and job.owner is not None for _, job in ranked))
        if not rides:
            return ranked
        kept = []
        for rank, job in ranked:
            if job.priority == Priority.STREAM and not job.background:
                try:
                    takes = self._riding(job)
                except Exception as exc:  # the hint's own job fails, visibly
                    failed.append((job, exc))
                    continue
                if takes is not None:  # typing work: it says what it takes riding
                    riding[id(job)] = takes
                    if takes < 1:
                        continue
            kept.append((rank, job))
        return kept

    def order(self, ranked: list[tuple[Rank, Job]]) -> list[tuple[Rank, Job]]:
        """Waiting jobs in run order: rules 1-3 (`rank`), then 6 and 7
        (`ordering`)."""
        ordered = ordering.order_fairly(ranked, self._served)
        if not any(ordering.is_unstarted_table_job(job) for _, job in ordered):
            return ordered
        ref = self._last_table_blocks if self._last_table_blocks is not None else frozenset(self.resident_table_blocks())
        # a group takes at most max_batch_rows rows: rerank that many picks (and one more) per group
        return ordering.rerank_slots(ordered, ref, self.rerank_max_delay, self.max_batch_rows + 1)

    def _note_service(self, rows: list[PlannedJob]) -> None:
        """Rules 6 and 7's memory: the tenants served now, the completions overtaken."""
        for row in rows:
            job = row.job
            self._served[job.tenant] = next(self._services)
            if ordering.is_unstarted_table_job(job):
                ordering.note_bypasses(job, self._waiting)
                self._last_table_blocks = job.table_blocks

    def _group(self, ranked: list[tuple[Rank, Job]], failed: list,
               riding: dict[int, int]) -> tuple[list[PlannedJob], BatchKind | None]:
        """Rule 4: the most urgent job runs; when it may be batched, the next
        ready jobs of its kind and *other owners* join it (one row per cache)
        while the group has at most `max_batch_rows` rows and its tokens fit
        `max_batch_tokens`. A group is one forward, so a submit arriving
        meanwhile waits for one bounded step. Rule 2b: in a group that may
        carry decode steps, the streaming answers' steps join before any
        other row: a typing forward never runs while an answer that could
        ride in it waits. Rule 2d: background work heading a group while
        answers wait takes at most `max_batch_tokens` (one long ingestion
        chunk was a second-long gap in every answer). Rule 2e: a job
        `apart_from_answers` (a sampled candidate) does not join a group
        that carries a streaming answer's decode step: seven sampled rows
        of another user's question made every step of an answer about twice
        as long; it runs when no answer streams."""
        for _, job in ranked:
            job.token_cap = None  # set again below for the typing rows that ride with answers
        if not ranked:
            return [], None
        first_rank, first = ranked[0]
        if first.background and any(self.streaming(job) for _, job in ranked[1:]):
            first.token_cap = self.max_batch_tokens  # rule 2d: a short forward while answers wait
        rows = [PlannedJob(first, first_rank, self._cost(first))]
        kind = self.batch_kind(first)
        if self.max_batch_rows == 1 or kind is None:
            return rows, kind
        # rule 2b: in a group that may carry decode steps, the streaming answers' steps join first
        riders = [(rank, job) for rank, job in ranked[1:]
                  if kind in (BatchKind.SHARED, BatchKind.ANY) and self.streaming(job) and self.batch_kind(job) == kind]
        rider_ids = {id(job) for _, job in riders}
        answers = bool(riders) or self.streaming(first)
        # rule 2c: with answers streaming, typing rows share `stream_tokens` (the head's share comes first)
        left = self.stream_tokens if answers else None
        if left is not None and first.priority == Priority.STREAM:
            rows[0], left = self._capped(rows[0], left, riding.get(id(first), rows[0].num_tokens))
        owners, tokens = {first.owner}, rows[0].num_tokens
        guard = ordering.GroupGuard(self.rerank_max_delay, first)  # rule 7's bound
        for rank, job in riders + [pair for pair in ranked[1:] if id(pair[1]) not in rider_ids]:
            if len(rows) >= self.max_batch_rows:
                break
            if not guard.allows(job) or job.owner in owners or self.batch_kind(job) != kind \
                    or (answers and job.apart_from_answers):  # rule 2e
                guard.left_out(job)
                continue
            try:
                cost = self._cost(job)
            except Exception as exc:
                failed.append((job, exc))
                continue
            row = PlannedJob(job, rank, cost)
            if left is not None and job.priority == Priority.STREAM:
                rides = riding.get(id(job), cost)
                if left < 1 or rides < 1:  # no share left, or nothing it would take while answers stream
                    guard.left_out(job)
                    continue
                row, left = self._capped(row, left, rides)
            if tokens + row.num_tokens > self.max_batch_tokens:
                job.token_cap = None
                guard.left_out(job)
                continue  # a smaller job further down may still fit
            guard.took(job)
            rows.append(row)
            owners.add(job.owner)
            tokens += row.num_tokens
        return rows, kind

    @staticmethod
    def _capped(row: PlannedJob, left: int, riding: int) -> tuple[PlannedJob, int]:
        """A typing row riding with answers: at most `left` new tokens
        (`Job.token_cap`) of the `riding` it would take; returns it and the
        typing tokens still left."""
        cost = min(riding, left)
        row.job.token_cap = cost
        return PlannedJob(row.job, row.rank, max(1, cost)), left - cost

    @staticmethod
    def _riding(job: Job) -> int | None:
        """Tokens a typing step takes when its row rides with streaming answers (rule 2c);
        None: the work is not typing (`JobWork.riding_cost`)."""
        takes = job.work.riding_cost()
        return None if takes is None else max(0, int(takes))

    def streaming(self, job: Job) -> bool:
        """A decode step of a streaming answer (FLASH, SUBMIT or POOL): someone
        waits for its next token (rules 2b, 2c)."""
        return job.decode_step and job.priority <= Priority.POOL

    def rank(self, job: Job, now: float) -> Rank:
        """(class, priority, key, arrival): lower runs first (rules 1-3), ranked
        afresh each iteration (a typing job's key changes while its user
        types, a deferred step's class with time). Rule 2d: a background
        STREAM job (ingestion, rebuilds: no person waits on them) ranks at
        BACKGROUND until it has waited `decode_defer_s`, its starvation bound;
        else every answer's decode step waited behind a producer's rows."""
        cls = Priority.DEFERRED_DECODE if self.deferred(job, now) else job.priority
        if job.background and cls == Priority.STREAM and now - job.queued_at < self.decode_defer_s:
            cls = Priority.BACKGROUND
        key = job.work.order_key()
        key = 0.0 if key is None else float(key)
        return Rank(cls, job.priority, key, job.arrival)

    def deferred(self, job: Job, now: float) -> bool:
        """A decode step of a submit or pool request that has waited less than
        `decode_defer_s` (rule 2): it ranks behind typing meanwhile, because a
        typing step is a future submit's TTFT and a delayed decode step costs
        one inter-token gap. FLASH decode steps are never deferred."""
        return (job.decode_step and Priority.SUBMIT <= job.priority <= Priority.POOL
                and now - job.queued_at < self.decode_defer_s)

    def batch_kind(self, job: Job) -> BatchKind | None:
        """Which group `job` may join (None: it runs alone; rule 4)."""
        if job.owner is None:
            return None
        scope = self.batch_scope
        if scope is BatchScope.ALL:
            return BatchKind.ANY
        if job.priority == Priority.STREAM:
            return BatchKind.SHARED if scope is BatchScope.TYPING_WITH_DECODE else BatchKind.TYPING
        if scope is BatchScope.TYPING or not job.decode_step:
            return None
        return BatchKind.DECODE if scope is BatchScope.TYPING_AND_DECODE_APART else BatchKind.SHARED

    @staticmethod
    def _cost(job: Job) -> int:
        return max(1, int(job.work.cost()))

    @staticmethod
    def preempts(priority: Priority, running: Job, needs_forward: bool = True) -> bool:
        """Whether a new job of `priority` asks the `running` step to stop
        (rule 5): typing and answer-ahead steps yield to any more urgent job;
        a deferred decode step, or an answer-ahead decode step, to any job of
        POOL or higher; a decode step to a new job at least as urgent as its
        request, never to typing. `needs_forward` False (a submit whose
        first answer tokens are known) stops nothing: the stopped rows would
        only run their forward again."""
        if not needs_forward:
            return False
        # a background job yields as a STREAM job does, whether it started at BACKGROUND or STREAM
        cls = min(running.running_class, Priority.STREAM) if running.background else running.running_class
        if cls == Priority.DEFERRED_DECODE:
            return priority <= Priority.POOL
        if running.decode_step:
            # an overdue decode step still yields to a new prefill at least as
            # urgent as its request: one inter-token gap against a whole TTFT;
            # an answer-ahead decode step (IDLE) only to a new prefill too
            return priority <= min(running.priority, Priority.POOL)
        return cls >= Priority.STREAM and priority < cls

    # -- postprocess ---------------------------------------------------------------

    def postprocess(self, plan: Plan, outcomes: list[StepOutcome], now: float) -> list[Job]:
        """Apply one iteration's outcomes (each job's commit of its row's
        result: more to do, or an error): a job with
        more to do is queued again (behind the jobs of its class already
        waiting), the others finish. Returns the jobs that finished."""
        finished = []
        for row, outcome in zip(plan.planned, outcomes):
            job = row.job
            job.preempt_requested = False
            if outcome.error is None:
                job.steps_run += 1
            if outcome.error is not None:
                self._finish(job, outcome.error)
            elif outcome.more and not job.cancelled:
                self.add(job, now)
                continue
            else:
                cancelled = job.cancelled and outcome.more
                self._finish(job, Cancelled(f"job {job.name!r} was cancelled") if cancelled else None)
            finished.append(job)
        return finished

    @staticmethod
    def _finish(job: Job, error: BaseException | None) -> None:
        job.state = JobState.FINISHED
        if error is not None and job.error is None:
            job.error = error
