"""The scheduler's rules, from tables of situations, with no model and no worker thread."""

from __future__ import annotations

import pytest

from headstart.engine.errors import Cancelled
from headstart.engine.sched.scheduler import Scheduler
from headstart.engine.sched.jobs import BatchKind, Job, JobState, Priority, StepOutcome
from tests.worker_gates import Work

P = Priority


def job(name, priority, *, owner=None, key=None, cost=1, decoding=False, background=False, riding=None,
        apart=False):
    made = Job(Work(key=key, cost=cost, decoding=decoding, riding=riding), priority, name, owner=owner)
    made.background, made.apart_from_answers = background, apart
    return made


def queued(scheduler, specs, now=0.0):
    jobs = [job(*spec[:2], **(spec[2] if len(spec) > 2 else {})) for spec in specs]
    for j in jobs:
        scheduler.add(j, now)
    return jobs


def run_order(scheduler, now):
    """Names in the order successive plans run them (each step finishes its job)."""
    order = []
    while scheduler.num_waiting:
        plan = scheduler.schedule(now)
        order.append("+".join(row.job.name for row in plan.planned))
        scheduler.postprocess(plan, [StepOutcome(False) for _ in plan.planned], now)
    return order


# (situation, queued jobs as (name, priority, options), defer_s, now, expected run order)
ORDER_CASES = [
    ("classes", [("ahead", P.IDLE), ("typing", P.STREAM), ("pool", P.POOL), ("submit", P.SUBMIT),
                 ("flash", P.FLASH)], 0.0, 0.0, ["flash", "submit", "pool", "typing", "ahead"]),
    ("arrival within a class", [("a", P.POOL), ("b", P.POOL), ("c", P.POOL)], 0.0, 0.0, ["a", "b", "c"]),
    ("shortest prefill first", [("long", P.SUBMIT, {"key": 0.9}), ("decoding", P.SUBMIT, {"key": 1.0}),
                                ("short", P.SUBMIT, {"key": 0.1})], 0.0, 0.0, ["short", "long", "decoding"]),
    ("unkeyed before keyed", [("keyed", P.STREAM, {"key": 5.0}), ("plain", P.STREAM)], 0.0, 0.0,
     ["plain", "keyed"]),
    ("a fresh decode step waits behind typing", [("decode", P.SUBMIT, {"decoding": True}),
                                                 ("typing", P.STREAM), ("ahead", P.IDLE)],
     1.0, 0.5, ["typing", "decode", "ahead"]),
    ("an overdue decode step takes its class back", [("decode", P.SUBMIT, {"decoding": True}),
                                                     ("typing", P.STREAM)], 1.0, 2.0, ["decode", "typing"]),
    ("a flash decode step is never deferred", [("typing", P.STREAM), ("flash", P.FLASH, {"decoding": True})],
     1.0, 0.0, ["flash", "typing"]),
    ("background work waits for a fresh decode step", [("ingest", P.STREAM, {"background": True}),
                                                       ("decode", P.SUBMIT, {"decoding": True}),
                                                       ("typing", P.STREAM), ("ahead", P.IDLE)],
     1.0, 0.5, ["typing", "decode", "ingest", "ahead"]),
    ("background work past its bound takes STREAM back", [("decode", P.SUBMIT, {"decoding": True}),
                                                          ("ingest", P.STREAM, {"background": True})],
     1.0, 2.0, ["decode", "ingest"]),
    ("background work ahead of a deferred decode once overdue", [("ingest", P.STREAM, {"background": True})],
     1.0, 1.5, ["ingest"]),
    ("an idle decode step is never deferred", [("ahead", P.IDLE, {"decoding": True}),
                                                ("ingest", P.STREAM, {"background": True})],
     1.0, 0.5, ["ingest", "ahead"]),
    ("a prefill of a submit is never deferred", [("typing", P.STREAM), ("prefill", P.SUBMIT)], 1.0, 0.0,
     ["prefill", "typing"]),
]


@pytest.mark.parametrize("situation,specs,defer_s,now,expected", ORDER_CASES, ids=[c[0] for c in ORDER_CASES])
def test_run_order(situation, specs, defer_s, now, expected):
    scheduler = Scheduler(decode_defer_s=defer_s)
    queued(scheduler, specs)
    assert run_order(scheduler, now) == expected


# (scope, rows, tokens budget, queued jobs, expected groups as run)
GROUP_CASES = [
    ("typing", 4, 64, [("t1", P.STREAM, {"owner": "a"}), ("t2", P.STREAM, {"owner": "b"}),
                       ("d1", P.SUBMIT, {"owner": "c", "decoding": True})], ["d1", "t1+t2"]),
    ("typing,decode", 4, 64, [("d1", P.SUBMIT, {"owner": "c", "decoding": True}),
                              ("d2", P.POOL, {"owner": "d", "decoding": True}),
                              ("t1", P.STREAM, {"owner": "a"})], ["d1+d2", "t1"]),
    ("typing+decode", 4, 64, [("d1", P.SUBMIT, {"owner": "c", "decoding": True}),
                              ("t1", P.STREAM, {"owner": "a"})], ["d1+t1"]),
    ("typing+decode", 4, 64, [("p1", P.SUBMIT, {"owner": "c"}), ("t1", P.STREAM, {"owner": "a"})],
     ["p1", "t1"]),
    ("all", 4, 64, [("p1", P.SUBMIT, {"owner": "c"}), ("t1", P.STREAM, {"owner": "a"}),
                    ("x", P.POOL)], ["p1+t1", "x"]),
    ("typing", 4, 64, [("a1", P.STREAM, {"owner": "a"}), ("a2", P.STREAM, {"owner": "a"}),
                       ("b1", P.STREAM, {"owner": "b"})], ["a1+b1", "a2"]),
    ("typing", 2, 64, [("a", P.STREAM, {"owner": "a"}), ("b", P.STREAM, {"owner": "b"}),
                       ("c", P.STREAM, {"owner": "c"})], ["a+b", "c"]),
    ("typing", 4, 10, [("a", P.STREAM, {"owner": "a", "cost": 6}), ("b", P.STREAM, {"owner": "b", "cost": 6}),
                       ("c", P.STREAM, {"owner": "c", "cost": 4})], ["a+c", "b"]),
    ("typing", 4, 64, [("a", P.STREAM, {"owner": "a"}), ("anon", P.STREAM)], ["a", "anon"]),
]


@pytest.mark.parametrize("scope,rows,budget,specs,expected", GROUP_CASES)
def test_groups(scope, rows, budget, specs, expected):
    scheduler = Scheduler(max_batch_rows=rows, max_batch_tokens=budget, batch_scope=scope, decode_defer_s=0.0)
    queued(scheduler, specs)
    assert run_order(scheduler, 0.0) == expected


def test_classes_are_integers_in_rule_1s_order():
    """One enum, integers, in the order the fractions they replaced ran
    (STREAM 3 < deferred decode 3.5 < background 3.75 < IDLE 4)."""
    assert list(P) == sorted(P) == [P.FLASH, P.SUBMIT, P.POOL, P.STREAM, P.DEFERRED_DECODE, P.BACKGROUND, P.IDLE]
    assert all(type(p.value) is int for p in P)


@pytest.mark.parametrize("cls", [P.DEFERRED_DECODE, P.BACKGROUND])
def test_a_job_is_never_queued_at_a_class_only_the_scheduler_gives(cls):
    with pytest.raises(ValueError, match="FLASH, SUBMIT, POOL, STREAM, IDLE"):
        Job(lambda: False, cls, "x")


def test_plan_is_typed_and_states_move_in_one_place():
    scheduler = Scheduler(max_batch_rows=4, batch_scope="typing,decode", decode_defer_s=1.0)
    a, b, d = queued(scheduler, [("a", P.STREAM, {"owner": "a", "cost": 3}), ("b", P.STREAM, {"owner": "b", "cost": 2}),
                                 ("d", P.SUBMIT, {"owner": "d", "decoding": True})])
    plan = scheduler.schedule(0.5)
    assert plan.jobs == [a, b] and plan.batch_kind is BatchKind.TYPING and plan.num_tokens == 5
    assert plan.deferred == (d,) and plan.planned[0].rank.cls == P.STREAM
    assert (a.state, b.state, d.state) == (JobState.RUNNING, JobState.RUNNING, JobState.WAITING)
    finished = scheduler.postprocess(plan, [StepOutcome(True), StepOutcome(False, ValueError("boom"))], 0.5)
    assert finished == [b] and b.state is JobState.FINISHED and isinstance(b.error, ValueError)
    assert a.state is JobState.WAITING and a.steps_run == 1 and b.steps_run == 0
    plan = scheduler.schedule(0.5)
    assert plan.jobs == [a] and plan.batch_kind is None  # the deferred decode step still waits
    assert plan.planned[0].rank.arrival > d.arrival  # a re-queued job goes behind the waiting ones


def test_cancelled_jobs_are_dropped_and_cancelled_running_ones_finish():
    scheduler = Scheduler()
    a, b = queued(scheduler, [("a", P.POOL), ("b", P.POOL)])
    a.cancel()
    plan = scheduler.schedule(0.0)
    assert plan.dropped == (a,) and plan.jobs == [b]
    assert a.state is JobState.FINISHED and isinstance(a.error, Cancelled)
    b.cancel()
    assert scheduler.postprocess(plan, [StepOutcome(True)], 0.0) == [b]
    assert isinstance(b.error, Cancelled) and scheduler.num_waiting == 0


def test_a_hint_that_raises_fails_its_own_job_only():
    scheduler = Scheduler(max_batch_rows=4)

    def broken():
        raise RuntimeError("bad hint")

    bad = Job(Work(key=broken), P.STREAM, "bad", owner="x")
    good = Job(lambda: False, P.STREAM, "good", owner="y")
    scheduler.add(bad, 0.0)
    scheduler.add(good, 0.0)
    plan = scheduler.schedule(0.0)
    assert plan.jobs == [good] and [j for j, _ in plan.failed] == [bad]
    assert isinstance(bad.error, RuntimeError) and bad.state is JobState.FINISHED


# (running job as (priority, decoding), its class when it started, new job's priority, preempts?)
PREEMPT_CASES = [
    ((P.STREAM, False), P.STREAM, P.SUBMIT, True),
    ((P.STREAM, False), P.STREAM, P.STREAM, False),
    ((P.IDLE, False), P.IDLE, P.STREAM, True),
    ((P.SUBMIT, False), P.SUBMIT, P.FLASH, False),  # a submit's prefill is never stopped
    ((P.SUBMIT, True), P.SUBMIT, P.SUBMIT, True),  # a decode step yields to a new submit
    ((P.SUBMIT, True), P.SUBMIT, P.STREAM, False),  # ... never to typing
    ((P.POOL, True), P.POOL, P.SUBMIT, True),
    ((P.SUBMIT, True), P.DEFERRED_DECODE, P.POOL, True),
    ((P.SUBMIT, True), P.DEFERRED_DECODE, P.STREAM, False),
    # answer-ahead of a finished question, a decode step riding in others' forwards: only a new prefill stops it
    ((P.IDLE, True), P.IDLE, P.POOL, True),
    ((P.IDLE, True), P.IDLE, P.SUBMIT, True),
    ((P.IDLE, True), P.IDLE, P.STREAM, False),
    ((P.IDLE, True), P.IDLE, P.IDLE, False),
    # a background job that started behind the answers yields as a STREAM job does: not to typing
    ((P.STREAM, False, True), P.BACKGROUND, P.STREAM, False),
    ((P.STREAM, False, True), P.BACKGROUND, P.POOL, True),
]


@pytest.mark.parametrize("running,cls,new,expected", PREEMPT_CASES)
def test_preemption(running, cls, new, expected):
    scheduler = Scheduler()
    j = job("r", running[0], decoding=running[1], background=running[2] if len(running) > 2 else False)
    scheduler.add(j, 0.0)
    j.running_class = float(cls)
    assert scheduler.preempts(new, j) is expected
    # a new job whose first step runs no forward (a submit with its first answer tokens known) stops nothing
    assert scheduler.preempts(new, j, needs_forward=False) is False


@pytest.mark.parametrize("kwargs", [{"batch_scope": "bogus"}, {"max_batch_rows": 0}, {"max_batch_tokens": 0},
                                    {"stream_tokens": 0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        Scheduler(**kwargs)


def run_groups(scheduler, now):
    """Each plan as "name:tokens+...", in the order successive plans run them
    (each step finishes its job)."""
    order = []
    while scheduler.num_waiting:
        plan = scheduler.schedule(now)
        order.append("+".join(f"{row.job.name}:{row.num_tokens}" for row in plan.planned))
        scheduler.postprocess(plan, [StepOutcome(False) for _ in plan.planned], now)
    return order


# Rules 2b and 2c: a streaming answer's decode step rides in every forward that may carry it,
# and typing rows in such a forward share `stream_tokens`.
# (situation, scope, rows, stream_tokens, defer_s, queued jobs, expected plans as run)
RIDE_CASES = [
    ("a deferred decode step rides the typing forward ahead of other typing rows", "typing+decode", 2, 8, 1.0,
     [("t1", P.STREAM, {"owner": "a", "cost": 2}), ("t2", P.STREAM, {"owner": "b", "cost": 2}),
      ("d1", P.SUBMIT, {"owner": "c", "decoding": True})], ["t1:2+d1:1", "t2:2"]),
    ("the typing head is capped while an answer rides", "typing+decode", 4, 8, 1.0,
     [("t1", P.STREAM, {"owner": "a", "cost": 20}), ("d1", P.SUBMIT, {"owner": "c", "decoding": True})],
     ["t1:8+d1:1"]),
    ("typing rows share the stream budget", "typing+decode", 8, 4, 0.0,
     [("d1", P.SUBMIT, {"owner": "c", "decoding": True}), ("t1", P.STREAM, {"owner": "a", "cost": 3}),
      ("t2", P.STREAM, {"owner": "b", "cost": 3})], ["d1:1+t1:3+t2:1"]),
    ("a typing row with no token left waits for the next forward", "typing+decode", 8, 3, 0.0,
     [("d1", P.SUBMIT, {"owner": "c", "decoding": True}), ("t1", P.STREAM, {"owner": "a", "cost": 3}),
      ("t2", P.STREAM, {"owner": "b", "cost": 2})], ["d1:1+t1:3", "t2:2"]),
    ("a typing row is capped at what it commits while riding", "typing+decode", 8, 8, 0.0,
     [("d1", P.SUBMIT, {"owner": "c", "decoding": True}), ("t1", P.STREAM, {"owner": "a", "cost": 6, "riding": 3}),
      ("t2", P.STREAM, {"owner": "b", "cost": 6, "riding": 6})], ["d1:1+t1:3+t2:5"]),
    ("a typing row with nothing to commit while riding leaves the budget to the next", "typing+decode", 8, 8, 0.0,
     [("d1", P.SUBMIT, {"owner": "c", "decoding": True}), ("t1", P.STREAM, {"owner": "a", "cost": 6, "riding": 0}),
      ("t2", P.STREAM, {"owner": "b", "cost": 6, "riding": 8})], ["d1:1+t2:8", "t1:6"]),
    ("a typing job with nothing to commit while riding does not head the group either", "typing+decode", 8, 8, 1.0,
     [("t1", P.STREAM, {"owner": "a", "cost": 6, "riding": 0}), ("d1", P.SUBMIT, {"owner": "c", "decoding": True})],
     ["d1:1", "t1:6"]),
    ("pool and flash answers ride too", "typing+decode", 8, 8, 1.0,
     [("t1", P.STREAM, {"owner": "a", "cost": 2}), ("d1", P.POOL, {"owner": "c", "decoding": True}),
      ("f1", P.FLASH, {"owner": "d", "decoding": True})], ["f1:1+d1:1+t1:2"]),
    ("without a streaming answer typing keeps the whole budget", "typing+decode", 4, 8, 0.0,
     [("t1", P.STREAM, {"owner": "a", "cost": 20}), ("t2", P.STREAM, {"owner": "b", "cost": 20})],
     ["t1:20+t2:20"]),
    ("answer-ahead never rides ahead of a streaming answer", "typing+decode", 8, 8, 0.0,
     [("ahead", P.IDLE, {"owner": "a"}), ("d1", P.SUBMIT, {"owner": "c", "decoding": True})],
     ["d1:1", "ahead:1"]),
    ("answer-ahead of a finished question (a decode step) rides with a streaming answer", "typing+decode", 8, 8,
     0.0, [("ahead", P.IDLE, {"owner": "a", "decoding": True}), ("d1", P.SUBMIT, {"owner": "c", "decoding": True})],
     ["d1:1+ahead:1"]),
    ("... behind the typing rows that fit the group", "typing+decode", 3, 8, 0.0,
     [("ahead", P.IDLE, {"owner": "a", "decoding": True}), ("d1", P.SUBMIT, {"owner": "c", "decoding": True}),
      ("t1", P.STREAM, {"owner": "b", "cost": 2}), ("t2", P.STREAM, {"owner": "d", "cost": 2})],
     ["d1:1+t1:2+t2:2", "ahead:1"]),
    ("... and joins a typing forward when no answer streams", "typing+decode", 8, 8, 0.0,
     [("ahead", P.IDLE, {"owner": "a", "decoding": True}), ("t1", P.STREAM, {"owner": "b", "cost": 3})],
     ["t1:3+ahead:1"]),
    ("answer-ahead never rides in typing-only groups", "typing", 8, 8, 0.0,
     [("ahead", P.IDLE, {"owner": "a", "decoding": True}), ("t1", P.STREAM, {"owner": "b", "cost": 3})],
     ["t1:3", "ahead:1"]),
    ("a sampled candidate never rides with a streaming answer; answer-ahead beside it does (rule 2e)",
     "typing+decode", 8, 8, 0.0,
     [("s1", P.IDLE, {"owner": "s", "decoding": True, "apart": True}),
      ("ahead", P.IDLE, {"owner": "a", "decoding": True}), ("d1", P.SUBMIT, {"owner": "c", "decoding": True})],
     ["d1:1+ahead:1", "s1:1"]),
    ("... nor with a streaming answer that heads a typing forward", "typing+decode", 8, 8, 1.0,
     [("s1", P.IDLE, {"owner": "s", "decoding": True, "apart": True}), ("t1", P.STREAM, {"owner": "b", "cost": 2}),
      ("d1", P.SUBMIT, {"owner": "c", "decoding": True})], ["t1:2+d1:1", "s1:1"]),
    ("... but sampled candidates ride together, and with typing rows, when no answer streams", "typing+decode",
     8, 8, 0.0,
     [("s1", P.IDLE, {"owner": "s", "decoding": True, "apart": True}),
      ("s2", P.IDLE, {"owner": "r", "decoding": True, "apart": True}), ("t1", P.STREAM, {"owner": "b", "cost": 3})],
     ["t1:3+s1:1+s2:1"]),
    ("a submit's prefill still runs alone", "typing+decode", 8, 8, 0.0,
     [("d1", P.SUBMIT, {"owner": "c", "decoding": True, "key": 1.0}), ("p1", P.SUBMIT, {"owner": "e", "key": 0.1, "cost": 30}),
      ("t1", P.STREAM, {"owner": "a", "cost": 2})], ["p1:30", "d1:1+t1:2"]),
    ("decode steps apart (typing,decode): a deferred one waits behind typing", "typing,decode", 8, 8, 1.0,
     [("t1", P.STREAM, {"owner": "a", "cost": 20}), ("d1", P.SUBMIT, {"owner": "c", "decoding": True})],
     ["t1:20", "d1:1"]),
    ("all: answers ride a submit's prefill group, the prefill is not capped", "all", 8, 2, 0.0,
     [("p1", P.SUBMIT, {"owner": "e", "key": 0.1, "cost": 30}),
      ("d1", P.SUBMIT, {"owner": "c", "decoding": True, "key": 1.0}),
      ("t1", P.STREAM, {"owner": "a", "cost": 5})], ["p1:30+d1:1+t1:2"]),
]


@pytest.mark.parametrize("situation,scope,rows,stream_tokens,defer_s,specs,expected", RIDE_CASES,
                         ids=[c[0] for c in RIDE_CASES])
def test_streaming_answers_ride_every_forward(situation, scope, rows, stream_tokens, defer_s, specs, expected):
    scheduler = Scheduler(max_batch_rows=rows, max_batch_tokens=64, batch_scope=scope, decode_defer_s=defer_s,
                          stream_tokens=stream_tokens)
    queued(scheduler, specs)
    assert run_groups(scheduler, 0.5) == expected


def test_a_riding_typing_row_gets_its_cap_and_loses_it_when_no_answer_streams():
    scheduler = Scheduler(max_batch_rows=4, batch_scope="typing+decode", stream_tokens=3, decode_defer_s=0.0)
    t, d = queued(scheduler, [("t", P.STREAM, {"owner": "a", "cost": 10}),
                              ("d", P.SUBMIT, {"owner": "c", "decoding": True})])
    plan = scheduler.schedule(0.0)
    assert plan.jobs == [d, t] and t.token_cap == 3 and d.token_cap is None
    scheduler.postprocess(plan, [StepOutcome(False), StepOutcome(True)], 0.0)  # the answer finished
    plan = scheduler.schedule(0.0)
    assert plan.jobs == [t] and t.token_cap is None and plan.num_tokens == 10


def test_a_typing_row_waits_while_riding_until_it_has_something_to_commit():
    """Rule 2c: a session with nothing to commit while answers stream (a
    partial word) waits; its hint is read afresh at each iteration, so it
    joins once its text rests or finishes, and runs whole once no answer streams."""
    scheduler = Scheduler(max_batch_rows=4, batch_scope="typing+decode", stream_tokens=32, decode_defer_s=0.0)
    due = []
    t, d = queued(scheduler, [("t", P.STREAM, {"owner": "a", "cost": 7, "riding": lambda: 9 if due else 0}),
                              ("d", P.SUBMIT, {"owner": "c", "decoding": True})])
    plan = scheduler.schedule(0.0)
    assert plan.jobs == [d] and t.state is JobState.WAITING
    scheduler.postprocess(plan, [StepOutcome(True)], 0.0)
    due.append(True)  # the text rested: the whole prompt is due
    plan = scheduler.schedule(0.0)
    assert plan.jobs == [d, t] and t.token_cap == 9
    scheduler.postprocess(plan, [StepOutcome(False), StepOutcome(True)], 0.0)
    due.clear()
    plan = scheduler.schedule(0.0)  # no answer streams: typing runs uncapped, whatever it would commit riding
    assert plan.jobs == [t] and t.token_cap is None and plan.num_tokens == 7


def test_a_riding_hint_is_read_once_per_iteration():
    """The hint tokenizes the session's settled words: read once per waiting
    typing job and iteration, whether the job waits, heads or rides."""
    reads = []
    scheduler = Scheduler(max_batch_rows=4, batch_scope="typing+decode", decode_defer_s=1.0)
    queued(scheduler, [("head", P.STREAM, {"owner": "a", "riding": lambda: reads.append("head") or 2}),
                       ("rider", P.STREAM, {"owner": "b", "riding": lambda: reads.append("rider") or 3}),
                       ("idle", P.STREAM, {"owner": "e", "riding": lambda: reads.append("idle") or 0}),
                       ("d", P.SUBMIT, {"owner": "c", "decoding": True})])
    plan = scheduler.schedule(0.5)
    assert [j.name for j in plan.jobs] == ["head", "d", "rider"]
    assert sorted(reads) == ["head", "idle", "rider"]


@pytest.mark.parametrize(("defer_s", "order"), [(0.0, "d,good"), (1.0, "good,d")],
                         ids=["a riding row's hint", "the group head's hint"])
def test_a_riding_hint_that_raises_fails_its_own_job_only(defer_s, order):
    def broken():
        raise RuntimeError("hint bug")

    scheduler = Scheduler(max_batch_rows=4, batch_scope="typing+decode", decode_defer_s=defer_s)
    bad, good, d = queued(scheduler, [("bad", P.STREAM, {"owner": "a", "riding": broken}),
                                      ("good", P.STREAM, {"owner": "b", "cost": 2, "riding": 2}),
                                      ("d", P.SUBMIT, {"owner": "c", "decoding": True})])
    plan = scheduler.schedule(0.5)  # with a deferral the typing rows head the group, the answer rides
    assert [j.name for j in plan.jobs] == order.split(",") and [job for job, _ in plan.failed] == [bad]
    assert isinstance(bad.error, RuntimeError) and bad.state is JobState.FINISHED


def test_background_work_runs_short_while_answers_wait():
    """Rule 2d: a background job past its bound runs, but in a short step
    (`token_cap`) when a streaming answer's decode step waits; alone, whole."""
    scheduler = Scheduler(max_batch_rows=4, max_batch_tokens=48, decode_defer_s=1.0)
    ingest, decode = queued(scheduler, [("ingest", P.STREAM, {"background": True}),
                                        ("decode", P.SUBMIT, {"decoding": True, "owner": "a"})])
    plan = scheduler.schedule(5.0)  # both overdue: STREAM ingest ranks behind the SUBMIT decode
    assert plan.jobs == [decode]
    scheduler.postprocess(plan, [StepOutcome(True)], 5.0)  # the answer has more tokens to go
    plan = scheduler.schedule(10.0)
    assert plan.jobs == [decode]  # its class again (overdue), ahead of ingestion
    scheduler.postprocess(plan, [StepOutcome(False)], 10.0)
    plan = scheduler.schedule(10.0)
    assert plan.jobs == [ingest] and ingest.token_cap is None  # no answer waits: a whole chunk
    scheduler = Scheduler(max_batch_rows=4, max_batch_tokens=48, decode_defer_s=1.0)
    ingest, decode = queued(scheduler, [("ingest", P.STREAM, {"background": True}),
                                        ("decode", P.SUBMIT, {"decoding": True, "owner": "a"})])
    plan = scheduler.schedule(0.5)  # the decode step is deferred (rule 2), the ingestion too: decode first
    assert plan.jobs == [decode]
    scheduler.postprocess(plan, [StepOutcome(True)], 0.5)
    plan = scheduler.schedule(1.2)  # ingestion overdue, the decode step fresh: ingestion runs, short
    assert plan.jobs == [ingest] and ingest.token_cap == 48
