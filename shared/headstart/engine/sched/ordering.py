"""The scheduler's ordering rules 6 and 7, as pure functions over ranked jobs.

6. **Fairness across tenants.** Within a class (the rank's class and
   priority), tenants take turns: every tenant's most urgent job (by rules
   1-3) goes before any tenant's second one, and so on; within a turn, the
   tenant served least recently goes first. So a tenant's many sessions
   cannot put another tenant's submit behind all of theirs, neither within
   one batched group nor over successive iterations (a tenant whose job
   needs many steps alternates with the others). With one tenant (or none)
   the order is exactly rules 1-3's.
7. **Reranking of table-cache completions** (papers/tablecache.md, section
   4.2.1). The completions of one tenant and class that have not started
   (their blocks are not loaded yet) keep the slots rule 6 gave them, but
   fill them in the paper's order: greedy nearest neighbour, the distance of
   two completions being the number of table blocks one needs and the other
   does not, starting from the blocks the last started completion placed
   (else those on the device). Starvation bound: a completion is overtaken
   by at most `max_delay` completions that arrived after it (one that has
   been is due and goes first, the earliest due first); `max_delay=0` is
   arrival order. This implies the paper's batch bound (placed at most
   `max_delay` positions after its arrival position).
"""

from __future__ import annotations

from collections.abc import Sequence

from headstart.engine.sched.jobs import Job, Rank


def fair_key(rank: Rank, turn: int, served_at: int) -> tuple:
    """Rule 6's sort key: (class, priority, the job's turn among its tenant's
    jobs of the class, the tenant's last service, key, arrival)."""
    return rank.cls, rank.priority, turn, served_at, rank.key, rank.arrival


def order_fairly(ranked: Sequence[tuple[Rank, Job]], served: dict) -> list[tuple[Rank, Job]]:
    """`ranked` in rule 6's order; `served` maps a tenant to the stamp of its
    last service (absent: never served, first)."""
    turns: dict[tuple, int] = {}
    keyed = []
    for rank, job in sorted(ranked, key=lambda pair: pair[0]):
        group = (rank.cls, rank.priority, job.tenant)
        turn = turns[group] = turns.get(group, -1) + 1
        keyed.append((fair_key(rank, turn, served.get(job.tenant, -1)), rank, job))
    keyed.sort(key=lambda item: item[0])
    return [(rank, job) for _, rank, job in keyed]


def is_unstarted_table_job(job: Job) -> bool:
    """A table-cache completion before its first step: rule 7 may move it."""
    return job.table_blocks is not None and job.steps_run == 0


def rerank_group(job: Job) -> tuple:
    """Completions rerank among those of the same priority and tenant."""
    return job.priority, job.tenant


def rerank_sequence(blocks: Sequence[frozenset[str]], bypassed: Sequence[int], ref: frozenset[str],
                    max_delay: int, limit: int | None = None) -> list[int]:
    """Rule 7's order of waiting completions, given in arrival order.

    Args:
        blocks: each completion's table blocks.
        bypassed: how many later arrivals already started before each.
        ref: the blocks on the device to start from.
        max_delay: the starvation bound.
        limit: pick only this many (the rest follow in arrival order): one
            iteration starts at most a group's rows, and each pick costs
            O(waiting), so the scheduler does not pay O(waiting^2) per step.
    Returns:
        A permutation of range(len(blocks)).
    Raises:
        ValueError: max_delay < 0, or the lists differ in length.
    """
    if max_delay < 0:
        raise ValueError(f"max_delay must be >= 0, got {max_delay}")
    if len(blocks) != len(bypassed):
        raise ValueError("blocks and bypassed must have one entry per completion")
    waiting = list(range(len(blocks)))  # arrival order: ties and due ones go earliest first
    passed = list(bypassed)
    order: list[int] = []
    while waiting and (limit is None or len(order) < limit):
        due = [i for i in waiting if passed[i] >= max_delay]
        pick = due[0] if due else min(waiting, key=lambda i: (len(ref ^ blocks[i]), i))
        waiting.remove(pick)
        order.append(pick)
        for i in waiting:
            if i < pick:
                passed[i] += 1
        ref = blocks[pick]
    return order + waiting


def rerank_slots(ordered: list[tuple[Rank, Job]], ref: frozenset[str], max_delay: int,
                 limit: int | None = None) -> list[tuple[Rank, Job]]:
    """Rule 7 applied to `ordered` (rule 6's order): each group's unstarted
    table-cache completions refill the slots they hold in rerank order (the
    first `limit` of each group reranked, see `rerank_sequence`)."""
    slots: dict[tuple, list[int]] = {}
    for index, (_, job) in enumerate(ordered):
        if is_unstarted_table_job(job):
            slots.setdefault(rerank_group(job), []).append(index)
    out = list(ordered)
    for indices in slots.values():
        pairs = sorted((ordered[i] for i in indices), key=lambda pair: pair[1].arrival)
        sequence = rerank_sequence([job.table_blocks for _, job in pairs], [job.bypassed for _, job in pairs], ref,
                                   max_delay, limit)
        for slot, pick in zip(indices, sequence):
            out[slot] = pairs[pick]
    return out


def note_bypasses(started: Job, waiting: Sequence[Job]) -> None:
    """`started` (an unstarted table-cache completion) runs now: every waiting
    one of its group that arrived earlier has been overtaken once more."""
    group = rerank_group(started)
    for job in waiting:
        if is_unstarted_table_job(job) and rerank_group(job) == group and job.arrival < started.arrival:
            job.bypassed += 1


class GroupGuard:
    """Rule 7's bound while a batched group forms: a completion left out of
    the group (another owner's turn, the token budget) must not be overtaken
    by more than `max_delay` completions, counting those the group takes."""

    def __init__(self, max_delay: int, first: Job):
        self.max_delay = max_delay
        self._placed = [first] if is_unstarted_table_job(first) else []
        self._skipped: list[Job] = []

    def allows(self, job: Job) -> bool:
        """Whether `job` may join without overtaking a completion past the bound."""
        if not is_unstarted_table_job(job):
            return True
        group = rerank_group(job)
        return all(self._overtakes(left) < self.max_delay for left in self._skipped
                   if rerank_group(left) == group and left.arrival < job.arrival)

    def took(self, job: Job) -> None:
        if is_unstarted_table_job(job):
            self._placed.append(job)

    def left_out(self, job: Job) -> None:
        if is_unstarted_table_job(job):
            self._skipped.append(job)

    def _overtakes(self, left: Job) -> int:
        group = rerank_group(left)
        return left.bypassed + sum(1 for job in self._placed
                                   if rerank_group(job) == group and job.arrival > left.arrival)
