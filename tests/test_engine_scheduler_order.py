"""The scheduler's rules 6 (fairness across tenants) and 7 (reranking of
table-cache completions, with its starvation bound), from tables of
situations, with no model and no worker thread."""

from __future__ import annotations

import random

import pytest

from headstart.engine.sched.scheduler import Scheduler
from headstart.engine.sched.ordering import rerank_sequence
from headstart.engine.sched.jobs import Job, Priority, StepOutcome
from tests.worker_gates import Work
from headstart.tables.rerank import rerank as paper_rerank
from tests.test_engine_scheduler import ORDER_CASES, queued, run_order

P = Priority


def make(name, priority=P.POOL, *, tenant=None, key=None, owner=None, cost=1, steps=1, blocks=None):
    """A job whose step runs `steps` times; `blocks` marks a table-cache completion."""
    left = {"n": steps}

    def step() -> bool:
        left["n"] -= 1
        return left["n"] > 0

    job = Job(Work(step, key=key, cost=cost), priority, name, owner=owner or name)
    job.tenant = tenant
    job.table_blocks = None if blocks is None else frozenset(blocks)
    return job


def run(scheduler, jobs, arrivals=None):
    """Names in the order successive plans run them ('+' joins a group); each
    step runs the job's step (which says whether more remains). `arrivals`
    maps an iteration to jobs added just before it."""
    for job in jobs:
        scheduler.add(job, 0.0)
    order, iteration = [], 0
    arrivals = arrivals or {}
    while scheduler.num_waiting or any(i >= iteration for i in arrivals):
        for job in arrivals.pop(iteration, []):
            scheduler.add(job, 0.0)
        iteration += 1
        if not scheduler.num_waiting:
            continue
        plan = scheduler.schedule(0.0)
        order.append("+".join(row.job.name for row in plan.planned))
        scheduler.postprocess(plan, [StepOutcome(row.job.work.step()) for row in plan.planned], 0.0)
    return order


# -- rule 6: fairness across tenants -------------------------------------------------

# (situation, jobs as (name, priority, options), expected run order)
FAIR_CASES = [
    ("one tenant's many submits do not hold another's behind all of them",
     [("a1", P.SUBMIT, {"tenant": "A", "key": 0.1}), ("a2", P.SUBMIT, {"tenant": "A", "key": 0.1}),
      ("a3", P.SUBMIT, {"tenant": "A", "key": 0.1}), ("b1", P.SUBMIT, {"tenant": "B", "key": 0.5})],
     ["a1", "b1", "a2", "a3"]),
    ("three tenants take turns",
     [("a1", P.POOL, {"tenant": "A"}), ("a2", P.POOL, {"tenant": "A"}), ("a3", P.POOL, {"tenant": "A"}),
      ("a4", P.POOL, {"tenant": "A"}), ("b1", P.POOL, {"tenant": "B"}), ("b2", P.POOL, {"tenant": "B"}),
      ("c1", P.POOL, {"tenant": "C"})],
     ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]),
    ("a long prefill alternates with another tenant's, step by step",
     [("a-long", P.SUBMIT, {"tenant": "A", "key": 0.1, "steps": 3}),
      ("b-short", P.SUBMIT, {"tenant": "B", "key": 0.9, "steps": 2})],
     ["a-long", "b-short", "a-long", "b-short", "a-long"]),
    ("classes still come first",
     [("a-typing", P.STREAM, {"tenant": "A"}), ("b-submit", P.SUBMIT, {"tenant": "B"}),
      ("a-submit", P.SUBMIT, {"tenant": "A"})],
     ["b-submit", "a-submit", "a-typing"]),
    ("within a tenant, shortest prefill first still holds",
     [("a-long", P.SUBMIT, {"tenant": "A", "key": 0.9}), ("a-short", P.SUBMIT, {"tenant": "A", "key": 0.1}),
      ("b", P.SUBMIT, {"tenant": "B", "key": 0.5})],
     ["a-short", "b", "a-long"]),
    ("internal jobs (no tenant) are a tenant of their own",
     [("a1", P.STREAM, {"tenant": "A"}), ("a2", P.STREAM, {"tenant": "A"}), ("p0", P.STREAM, {})],
     ["a1", "p0", "a2"]),
]


@pytest.mark.parametrize("situation,specs,expected", FAIR_CASES, ids=[c[0] for c in FAIR_CASES])
def test_fair_order(situation, specs, expected):
    jobs = [make(name, priority, **options) for name, priority, options in specs]
    assert run(Scheduler(max_batch_rows=1), jobs) == expected  # one job a plan: the order of service


def test_the_tenant_served_least_recently_goes_first():
    scheduler = Scheduler()
    assert run(scheduler, [make("b0", tenant="B")]) == ["b0"]  # B was served; A never was
    jobs = [make("b1", tenant="B"), make("a1", tenant="A")]
    assert run(scheduler, jobs) == ["a1", "b1"]


def test_a_batched_group_takes_one_row_per_tenant_first():
    scheduler = Scheduler(max_batch_rows=2, max_batch_tokens=64, batch_scope="typing")
    jobs = [make(f"a{i}", P.STREAM, tenant="A") for i in range(3)] + [make("b0", P.STREAM, tenant="B")]
    assert run(scheduler, jobs) == ["a0+b0", "a1+a2"]


@pytest.mark.parametrize("situation,specs,defer_s,now,expected", ORDER_CASES, ids=[c[0] for c in ORDER_CASES])
def test_one_tenant_keeps_the_order_of_rules_1_to_3(situation, specs, defer_s, now, expected):
    scheduler = Scheduler(decode_defer_s=defer_s)
    for job in queued(scheduler, specs):
        job.tenant = "only"
    assert run_order(scheduler, now) == expected


# -- rule 7: reranking table-cache completions -----------------------------------------

# (situation, blocks on the device, max_delay, completions as (name, blocks), expected run order)
RERANK_CASES = [
    ("blocks already on the device first", {"x", "y"}, 16,
     [("t1", {"a", "b"}), ("t2", {"x", "y"}), ("t3", {"x"})], ["t2", "t3", "t1"]),
    ("then the nearest to the last one placed", {"x"}, 16,
     [("t1", {"x", "a"}), ("t2", {"b"}), ("t3", {"a"})], ["t1", "t3", "t2"]),
    ("ties go to the earliest arrival", {"x"}, 16,
     [("t1", {"a"}), ("t2", {"b"}), ("t3", {"c"})], ["t1", "t2", "t3"]),
    ("max_delay 0 is arrival order", {"x", "y"}, 0,
     [("t1", {"a", "b"}), ("t2", {"x", "y"}), ("t3", {"x"})], ["t1", "t2", "t3"]),
    ("a completion overtaken max_delay times is due", {"x"}, 1,
     [("t1", {"a", "b"}), ("t2", {"x"}), ("t3", {"x"})], ["t2", "t1", "t3"]),
]


@pytest.mark.parametrize("situation,resident,max_delay,specs,expected", RERANK_CASES,
                         ids=[c[0] for c in RERANK_CASES])
def test_rerank_order(situation, resident, max_delay, specs, expected):
    scheduler = Scheduler(rerank_max_delay=max_delay)
    scheduler.resident_table_blocks = lambda: frozenset(resident)
    jobs = [make(name, blocks=blocks) for name, blocks in specs]
    assert run(scheduler, jobs) == expected


def ordered(scheduler, jobs):
    """The names in the order the scheduler would run the waiting jobs now."""
    for job in jobs:
        scheduler.add(job, 0.0)
    return [job.name for _, job in scheduler.order([(scheduler.rank(j, 0.0), j) for j in jobs])]


def test_other_jobs_keep_their_slots():
    """Jobs of other kinds, and completions that started, are not moved."""
    scheduler = Scheduler()
    scheduler.resident_table_blocks = lambda: frozenset({"x"})
    started = make("started", blocks={"q"})
    started.steps_run = 1
    jobs = [make("t1", blocks={"a"}), make("plain"), started, make("t2", blocks={"x"})]
    assert ordered(scheduler, jobs) == ["t2", "plain", "started", "t1"]


def test_reranking_is_per_tenant_and_tenants_take_turns():
    scheduler = Scheduler()
    scheduler.resident_table_blocks = lambda: frozenset({"x"})
    jobs = [make("a-far", tenant="A", blocks={"q"}), make("a-near", tenant="A", blocks={"x"}),
            make("b-far", tenant="B", blocks={"q", "r"})]
    assert run(scheduler, jobs) == ["a-near", "b-far", "a-far"]


def test_a_flood_of_near_completions_cannot_starve_a_far_one():
    """Online: one completion that matches nothing on the device, and a new one
    that matches arriving before every iteration: the far one waits at most
    max_delay overtakes."""
    for max_delay in (0, 1, 3, 5):
        scheduler = Scheduler(rerank_max_delay=max_delay)
        scheduler.resident_table_blocks = lambda: frozenset({"x"})
        far = make("far", blocks={"z"})
        arrivals = {i: [make(f"near{i}", blocks={"x"})] for i in range(1, 12)}
        order = run(scheduler, [far, make("near0", blocks={"x"})], arrivals)
        assert order.index("far") == max_delay, (max_delay, order)


def test_a_group_never_lets_a_completion_overtake_a_due_one():
    """Scope "all": the due completion does not fit the group's token budget,
    so no later completion joins the group in its place."""
    scheduler = Scheduler(max_batch_rows=4, max_batch_tokens=10, batch_scope="all", rerank_max_delay=1)
    scheduler.resident_table_blocks = lambda: frozenset({"x"})
    first = make("near0", blocks={"x"}, cost=4)
    due = make("far", blocks={"z"}, cost=8)
    later = [make("near1", blocks={"x"}, cost=1), make("near2", blocks={"x"}, cost=1)]
    for job in (due, first, *later):
        scheduler.add(job, 0.0)
    plan = scheduler.schedule(0.0)
    names = [row.job.name for row in plan.planned]
    assert names[0] == "near0" and "far" not in names  # far is due after near0 overtook it
    assert not {"near1", "near2"} & set(names)  # they would overtake it again
    scheduler.postprocess(plan, [StepOutcome(False) for _ in plan.planned], 0.0)
    assert scheduler.schedule(0.0).planned[0].job.name == "far"


def test_sequence_matches_the_papers_batch_rerank_and_its_bound():
    """On a static batch, rule 7 is the paper's greedy nearest neighbour
    (`tables.rerank.rerank`) when the bound never binds, and never places a
    completion more than max_delay positions after its arrival."""
    rng = random.Random(7)
    tables = [f"t{i}" for i in range(8)]
    for _ in range(200):
        n = rng.randint(1, 9)
        sets = [frozenset(rng.sample(tables, rng.randint(1, 4))) for _ in range(n)]
        anchor = frozenset(rng.sample(tables, rng.randint(0, 3)))
        assert rerank_sequence(sets, [0] * n, anchor, n) == paper_rerank(sets, max_delay=n, anchor=anchor)
        max_delay = rng.randint(0, 3)
        order = rerank_sequence(sets, [0] * n, anchor, max_delay)
        assert sorted(order) == list(range(n))
        for position, index in enumerate(order):
            assert position <= index + max_delay
            overtaken_by = [j for j in order[:position] if j > index]
            assert len(overtaken_by) <= max_delay


def test_a_limited_sequence_starts_as_the_whole_one():
    """The scheduler reranks only the picks one iteration can use; the rest
    follow in arrival order."""
    rng = random.Random(11)
    tables = [f"t{i}" for i in range(6)]
    for _ in range(100):
        n = rng.randint(1, 12)
        sets = [frozenset(rng.sample(tables, rng.randint(1, 3))) for _ in range(n)]
        bypassed = [rng.randint(0, 2) for _ in range(n)]
        whole = rerank_sequence(sets, bypassed, frozenset({"t0"}), 2)
        for limit in range(n + 1):
            part = rerank_sequence(sets, bypassed, frozenset({"t0"}), 2, limit)
            assert part[:limit] == whole[:limit]
            assert part[limit:] == sorted(part[limit:]) and sorted(part) == list(range(n))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="max_delay"):
        rerank_sequence([frozenset()], [0], frozenset(), -1)
    with pytest.raises(ValueError, match="one entry"):
        rerank_sequence([frozenset()], [], frozenset(), 1)
    with pytest.raises(ValueError, match="rerank_max_delay"):
        Scheduler(rerank_max_delay=-1)


def test_the_scheduler_bench_runs_end_to_end(tmp_path):
    from bench.scheduler_order import run_scheduler_bench

    report = run_scheduler_bench(tmp_path, repeats=1)
    assert {p.name for p in tmp_path.iterdir()} == {"scheduler_order.json", "scheduler_order.md",
                                                   "scheduler_order.png"}
    for row in report["fairness"]:  # B runs after one of A's steps, not after all of them
        assert (row["steps_before_b_named"], row["steps_before_b_one_tenant"]) == (1, 2 * row["flood"])
    for row in report["reranking"]:
        assert row["max_overtaken"] <= row["max_delay"]
    loads = {row["max_delay"]: row["block_loads"] for row in report["reranking"]}
    assert loads[16] < loads[0]
