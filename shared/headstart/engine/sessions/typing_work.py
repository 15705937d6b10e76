"""A session's typing job: each step brings its cache one chunk toward what
the confirmation policy wants for the newest text.

A step (worker thread, STREAM priority) reads the newest snapshot
(`Session.read_snapshot`), asks the policy for the target, and prepares one
chunk toward it by the catch-up rule (`requests.catch_up`). Its commit
counts the work, reports progress and hands the outcome to the session
(`Session.after_typing`), which says whether to run again (more chunks, or a
newer snapshot arrived) or, caught up, queues answer-ahead.

While the row rides in a forward with streaming answers (the scheduler caps
it: its rule 2c), it takes only what `policy.riding_target` allows
(`riding_target_for`): every token it adds lengthens every answer's forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from headstart.engine.requests.catch_up import CatchUp, start_catch_up
from headstart.engine.runner.rows import Row, RowResult
from headstart.engine.sched.jobs import Job, JobWork
from headstart.engine.sessions.policy import CacheTarget, PaperPolicy, looks_complete, riding_target
from headstart.prompt import common_prefix_len, uncached_tokens


@dataclass
class InFlight:
    """The extension a step of a session has in flight: the ids it will leave
    in the cache (None for an answer-ahead step), how many of them were
    cached before it, and whether a newer snapshot made it useless (polled
    between decoder layers: it then stops)."""

    ids: list[int] | None
    base: int
    superseded: bool = False


@dataclass(frozen=True)
class TypingSnapshot:
    """What a typing step read of its session: the job it runs as and the newest text."""

    job: Job | None
    text: str
    last_change: float
    seq: int


@dataclass(frozen=True)
class _TypingStep:
    """A typing row in flight, for its commit."""

    snapshot: TypingSnapshot
    inflight: InFlight
    catch_up: CatchUp
    target: CacheTarget


class TypingWork(JobWork):
    """The typing job of `session` (a `Session`)."""

    def __init__(self, session):
        self.session = session
        self._pending: _TypingStep | None = None

    # -- the step and its commit (worker thread) ---------------------------------

    def step(self) -> "Row | bool":
        try:
            return self._prepare()
        except BaseException:
            self.session.typing_failed(None)  # nothing stays queued: the next snapshot queues a step
            raise

    def _prepare(self) -> "Row | bool":
        session = self.session
        snapshot = session.read_snapshot()
        if snapshot is None:  # a submit took over, or closed
            return False
        now, kv, limits = session.clock(), session.kv_state, session.limits
        target = session.policy.target(session.prompt, snapshot.text, now, snapshot.last_change)
        wanted = target.ids is not None and len(target.ids) <= limits.max_prompt_tokens
        if not wanted or session.ahead.usable_for(kv.ids, target.ids):
            return session.after_typing(snapshot.job, target, wanted, more=False)
        job = snapshot.job
        riding = job is not None and job.token_cap is not None
        if riding and session.policy.keeps_logits:
            target = riding_target_for(session, target, snapshot.text, now, snapshot.last_change)
        session.ahead.reset()
        inflight = InFlight(None, kv.num_tokens)
        # the scheduler caps a typing row that rides with streaming answers (its rule 2c)
        chunk = max(1, min(limits.chunk_tokens, job.token_cap)) if riding else limits.chunk_tokens
        # keeps_logits: the last token's logits at hand at submit (the headstart policy)
        catch_up = start_catch_up(session.runner, kv, target.ids, chunk,
                                  session.policy.keeps_logits and not target.partial,
                                  lambda: session.should_stop(inflight, job))
        session.wasted_tokens += catch_up.dropped
        inflight.ids, inflight.base = kv.ids + catch_up.plan.chunk, kv.num_tokens
        session.track(inflight)
        self._pending = _TypingStep(snapshot, inflight, catch_up, target)
        return catch_up.row

    def commit(self, row: Row, result: RowResult) -> bool:
        step, self._pending = self._pending, None
        session = self.session
        session.untrack(step.inflight)
        if result.error is not None:  # the cache may be torn: nothing more from this step
            session.typing_failed(step.snapshot.job)
            raise result.error
        chunk = step.catch_up.plan.chunk
        session.computed_tokens += len(chunk)  # aborted work was spent too
        if result.ran:
            more = not step.catch_up.plan.last
        else:  # start over from the newest snapshot
            session.wasted_tokens += len(chunk)
            session.aborted_extensions += 1
            more = True
        session.report_progress(step.snapshot.text, step.snapshot.seq)
        return session.after_typing(step.snapshot.job, step.target, True, more)

    # -- the scheduler's hints (worker thread, between steps) --------------------

    def order_key(self) -> float:
        """STREAM order: the session whose text changed least recently first.
        A user who paused is about to press Enter, and their text is stable;
        one still typing would have part of the extension cropped anyway."""
        return self.session.last_change

    def cost(self) -> int:
        """Tokens the next step will likely run: the newest full prompt past
        what the cache shares with it."""
        session = self.session
        return uncached_tokens(session.kv_state.ids, session.prompt.prompt_ids(session.text),
                               session.limits.chunk_tokens)

    def riding_cost(self) -> int:
        """Tokens the next step takes if its row rides with streaming answers
        (rule 2c): 0 while only a partial word, or fewer settled tokens than a
        bulk, are new (`policy.riding_target`)."""
        session = self.session
        if not session.policy.keeps_logits:  # the paper's policy takes what it would alone
            return self.cost()
        if not session.is_typing():
            return 1  # a submit took over, or closed: the step only ends the job, let it run
        text = session.text
        target = riding_target_for(session, CacheTarget(session.prompt.prompt_ids(text)), text, session.clock(),
                                   session.last_change)
        if not target.partial:  # the whole prompt, as `cost` counts it
            return uncached_tokens(session.kv_state.ids, target.ids, session.limits.chunk_tokens)
        return len(target.ids) - common_prefix_len(session.kv_state.ids, target.ids)


def riding_target_for(session, target: CacheTarget, text: str, now: float, last_change: float) -> CacheTarget:
    """What a typing row riding with streaming answers takes (`policy.riding_target`).
    While the user types, the partial word and the end of the turn would be
    cropped at the next keystroke, so only settled words, in bulk; the whole
    prompt once the text reads as finished or has rested `typing_settle_s`. A
    recheck at that time brings the rest in even if no keystroke comes."""
    limits = session.limits
    settle = limits.typing_settle_s
    if settle <= 0:
        return target
    complete = now - last_change >= settle or looks_complete(text)
    settled = [] if complete else session.prompt.partial_ids(PaperPolicy.settled_prefix(text))
    return riding_target(target.ids, settled, session.kv_state.ids, complete, limits.typing_bulk_tokens,
                         last_change + settle)
