"""Unit tests of the engine's parts: policies, common-prefix crop, P0 keys and
store, worker priorities, typed errors, session bounds."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch

from headstart.engine.errors import (
    InvalidInput, PromptTooLong, ResourceExhausted, SessionClosed, StaleSequence, TextTooLong, validate_text,
)
from headstart.engine.requests.generation import SamplingParams
from headstart.engine.kv.state import KVState
from headstart.engine.kv.p0_store import P0Store, p0_key
from headstart.engine.sessions.policy import HeadstartPolicy, PaperPolicy, looks_complete, make_policy, riding_target
from headstart.engine.sched.jobs import Call, Priority
from headstart.engine.sched.worker import ForwardWorker
from tests.worker_gates import Work, hold_worker, queue_gate
from headstart.prompt import common_prefix_len


@pytest.mark.parametrize(("a", "b", "n"), [
    ([], [], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2], 2), ([1, 2], [1, 2, 3], 2),
    ([1, 2, 3], [1, 9, 3], 1), ([5], [6], 0),
])
def test_common_prefix_len(a, b, n):
    assert common_prefix_len(a, b) == n


@pytest.mark.parametrize(("text", "expected"), [
    ("", ""), ("show", ""), ("show ", "show "), ("show the nam", "show the "),
    ("how many?", "how many?"), ("a,b", "a,"), ("x\ny", "x\n"), ("tab\there", "tab\t"),
])
def test_paper_committable(text, expected):
    assert PaperPolicy.settled_prefix(text) == expected


@pytest.mark.parametrize(("text", "now", "commits", "recheck"), [
    ("show the nam", 0.1, True, None),    # debounce elapsed (last change at 0.0 - 0.3)
    ("show the nam", 0.0, False, 0.3),    # within δ: wait, recheck when it expires
    ("the end. ", 0.0, True, None),       # two boundaries in a row: at once
    ("word", 5.0, False, None),           # nothing settled yet
])
def test_paper_policy_target(tiny_runtime, text, now, commits, recheck):
    prompt = tiny_runtime.prompt_for("world_1")
    last_change = 0.0 if now == 0.0 or text == "word" else -0.3
    target = PaperPolicy(0.3).target(prompt, text, now, last_change)
    assert (target.ids is not None) == commits
    assert target.recheck_at == (pytest.approx(recheck) if recheck is not None else None)
    if commits:
        assert target.ids == prompt.partial_ids(PaperPolicy.settled_prefix(text))


def test_headstart_policy_commits_whole_prompt(tiny_runtime):
    prompt = tiny_runtime.prompt_for("world_1")
    target = HeadstartPolicy().target(prompt, "how many ci", 0.0, 0.0)
    assert target.ids == prompt.prompt_ids("how many ci") and target.recheck_at is None


@pytest.mark.parametrize(("text", "complete"), [
    ("How many singers are there?", True), ("List the names.", True), ("Show it!", True),
    ('Titled "Yes".', True), ("Older than (30).", True), ("older than 30?", True), ("between 1 and 9 .", True),
    ("How many? ", False), ("older than 3.", False), ("show the nam", False), ("", False), ("?", False),
    ("x...", False),
])
def test_looks_complete(text, complete):
    assert looks_complete(text) is complete


def test_riding_target_waits_for_a_bulk_of_settled_words(tiny_runtime):
    prompt = tiny_runtime.prompt_for("world_1")
    text = "how many cities are in the country with the largest popul"
    full = prompt.prompt_ids(text)
    settled = prompt.partial_ids(PaperPolicy.settled_prefix(text))
    base = len(prompt.base_ids)
    stable = common_prefix_len(full, settled)
    assert stable - base >= 6
    cached = full[: stable - 3]  # three settled tokens not yet cached: fewer than the bulk
    waiting = riding_target(full, settled, cached, False, 4, 9.0)
    assert waiting.ids == cached and waiting.partial and waiting.recheck_at == 9.0
    bulk = riding_target(full, settled, cached[: stable - 4], False, 4, 9.0)  # four new: the bulk goes
    assert bulk.ids == full[:stable] and bulk.partial
    # a cache past the settled words (an earlier snapshot's whole prompt) keeps what still matches
    assert len(full) > stable + 1
    kept = riding_target(full, settled, full[: stable + 1] + [7, 7], False, 4, 9.0)
    assert kept.ids == full[: stable + 1]
    # a cache that diverges is cropped back to what it shares with the text
    assert riding_target(full, settled, full[:base] + [7, 7], False, 100, 9.0).ids == full[:base]
    done = riding_target(full, [], cached, True, 4, 9.0)
    assert done.ids == full and not done.partial and done.recheck_at is None


def test_unknown_policy_lists_valid():
    with pytest.raises(ValueError, match="headstart, paper"):
        make_policy("greedy")


def test_prompt_base_is_prefix_of_every_prompt(tiny_runtime):
    prompt = tiny_runtime.prompt_for("car_1")
    for q in ["", "What", " leading space", "\nnewline", "<|im_end|>", "ünïcödé", "1234"]:
        assert prompt.prompt_ids(q)[: len(prompt.base_ids)] == prompt.base_ids


def test_typed_special_tokens_stay_text(tiny_runtime):
    prompt = tiny_runtime.prompt_for("world_1")
    im_end = tiny_runtime.loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = prompt.prompt_ids("<|im_end|>")
    assert ids.count(im_end) == prompt.prompt_ids("x").count(im_end)  # only the template's


def test_prompt_memo_keeps_many_typists_snapshots(tiny_runtime, monkeypatch):
    """One builder serves every session on its database: the texts of many
    typists stay remembered (with 8 entries, 8 typists missed on every call,
    each miss tokenizing the whole schema), and a remembered prompt is a
    fresh list equal to a fresh tokenization."""
    from headstart.prompt import PromptBuilder

    prompt = PromptBuilder(tiny_runtime.loaded.tokenizer, tiny_runtime.prompt_for("world_1").schema)
    texts = [f"how many cities in country {i}" for i in range(64)]
    fresh = [prompt.prompt_ids(t) for t in texts]
    partial = [prompt.partial_ids(t) for t in texts]  # the riding hint asks for these at every iteration
    assert all(p == f[: len(p)] and len(p) < len(f) for p, f in zip(partial, fresh))
    monkeypatch.setattr(prompt, "_encode_plain", lambda text: pytest.fail("tokenized again"))
    for text, ids, head in zip(texts, fresh, partial):
        again = prompt.prompt_ids(text)
        assert again == ids and again is not ids
        again.append(0)  # a caller may extend its copy
        assert prompt.prompt_ids(text) == ids and prompt.partial_ids(text) == head
    monkeypatch.undo()
    from headstart import prompt as prompt_module

    for i in range(prompt_module._MEMO_ENTRIES + 10):  # bounded: the oldest go first
        prompt.prompt_ids(f"question {i}")
    assert len(prompt._memo) == prompt_module._MEMO_ENTRIES and texts[-1] not in prompt._memo


def test_crop_then_extend_equals_prefill(tiny_runtime):
    runner = tiny_runtime.runner
    ids = tiny_runtime.prompt_for("world_1").prompt_ids("How many cities?")
    state = runner.prefill(ids[:-3] + [11, 12, 13, 14])
    assert state.crop(len(ids) - 3) == 4 and state.last_logits is None
    runner.extend(state, ids[-3:])
    reference = runner.prefill(ids)
    assert state.ids == reference.ids
    torch.testing.assert_close(state.last_logits, reference.last_logits, rtol=0, atol=1e-10)
    for a, b in zip(state.cache.layers, reference.cache.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-10)


def test_crop_to_zero_and_copy_is_deep(tiny_runtime):
    state = tiny_runtime.runner.prefill([1, 2, 3])
    clone = state.copy()
    state.crop(0)
    assert (state.cache, state.ids, clone.ids, clone.num_tokens) == (None, [], [1, 2, 3], 3)
    assert clone.cache.layers[0].keys.shape[-2] == 3


@pytest.mark.parametrize(("a", "b", "same"), [
    (("m", "float32", [1, 2]), ("m", "float32", [1, 2]), True),
    (("m", "float32", [1, 2]), ("m", "bfloat16", [1, 2]), False),
    (("m", "float32", [1, 2]), ("n", "float32", [1, 2]), False),
    (("m", "float32", [1, 2]), ("m", "float32", [1, 2, 3]), False),
    (("m", "float32", [12]), ("m", "float32", [1, 2]), False),
])
def test_p0_key(a, b, same):
    assert (p0_key(*a) == p0_key(*b)) == same
    assert len(p0_key(*a)) == 64


def test_p0_store_disk_round_trip(tmp_path, tiny_runtime):
    state = tiny_runtime.runner.prefill([5, 6, 7, 8])
    P0Store(tmp_path).put("k" * 64, state)
    fresh = P0Store(tmp_path)  # a new process: memory empty, disk warm
    loaded = fresh.get("k" * 64, torch.device("cpu"))
    assert (loaded.ids, fresh.hits_disk, fresh.hits_memory) == ([5, 6, 7, 8], 1, 0)
    torch.testing.assert_close(loaded.cache.layers[1].values, state.cache.layers[1].values, rtol=0, atol=0)
    (tmp_path / f"p0-{'x' * 64}.safetensors").write_bytes(b"garbage")
    assert fresh.get("x" * 64, torch.device("cpu")) is None  # corrupt file = a miss, removed
    assert not (tmp_path / f"p0-{'x' * 64}.safetensors").exists()


def test_second_runtime_opens_without_prefill(tmp_path):
    from headstart.engine.runtime import EngineRuntime

    first = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_dir=tmp_path)
    first.open_session("world_1")
    first.shutdown()
    second = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_dir=tmp_path)
    steps_before = second.worker.steps_run
    second.open_session("world_1")
    assert (second.p0_store.hits_disk, second.worker.steps_run) == (1, steps_before)
    second.shutdown()


def test_a_p0_prefill_is_a_planned_row_with_the_lone_prefills_bits(tmp_path):
    """P0 is prefilled as a row the scheduler plans (its tokens counted, as a shared cache's),
    not as an opaque `run_sync` step, and holds the bits of a lone `runner.prefill`."""
    from headstart.engine.runtime import EngineRuntime

    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_on_disk=False)
    try:
        prompt = runtime.prompt_for("world_1")
        tokens_before, shared_before = runtime.worker.forward_tokens, runtime.worker.shared_tokens
        state = runtime.p0_source.base_state("world_1", prompt)
        assert runtime.worker.shared_tokens - shared_before == len(prompt.base_ids)
        assert runtime.worker.forward_tokens == tokens_before  # not a client's work (issue 29's measure)
        lone = runtime.worker.run_sync(lambda: runtime.runner.prefill(prompt.base_ids))
        assert state.ids == lone.ids and torch.equal(state.last_logits, lone.last_logits)
        for ours, theirs in zip(state.cache.layers, lone.cache.layers):
            assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    finally:
        runtime.shutdown()


def _two_spans(state: KVState, first: list[int], second: list[int], log: list[str]):
    """Steps: two forwards on one state with work between them; returns the state's length."""
    from headstart.engine.sched.extensions import Extension

    log.append("before")
    yield Extension(state, first)
    log.append(f"between:{state.num_tokens}")
    yield Extension(state, second)
    log.append("after")
    return state.num_tokens


def test_extension_steps_run_inline_and_as_planned_rows_alike():
    """A generator of extensions gives the same cache run inline (`run_inline`) or as one job's
    planned rows (`ForwardWorker.run_steps_sync`: each forward counted, its other work between
    them on the worker), and a step that raises, or a forward that fails, fails the call."""
    from headstart.engine.runtime import EngineRuntime
    from headstart.engine.sched.extensions import Extension, run_inline

    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_on_disk=False)
    try:
        runner, worker = runtime.runner, runtime.worker
        first, second = [11, 12, 13, 14], [15, 16]
        inline_log, planned_log = [], []
        inline = KVState()
        assert worker.run_sync(lambda: run_inline(_two_spans(inline, first, second, inline_log), runner)) == 6
        tokens_before = worker.forward_tokens
        planned = KVState()
        assert worker.run_steps_sync(runner, _two_spans(planned, first, second, planned_log), name="two") == 6
        assert worker.forward_tokens - tokens_before == 6  # both forwards planned and counted
        assert inline_log == planned_log == ["before", "between:4", "after"]
        assert planned.ids == inline.ids and torch.equal(planned.last_logits, inline.last_logits)

        def broken():
            yield Extension(KVState(), [11, 12])
            raise ValueError("a step failed")

        with pytest.raises(ValueError, match="a step failed"):
            worker.run_steps_sync(runner, broken())

        def bad_forward():
            yield Extension(KVState(), [10 ** 9])  # no such token: the forward fails
            return "unreached"

        with pytest.raises(IndexError):
            worker.run_steps_sync(runner, bad_forward())
        assert worker.run_steps_sync(runner, _two_spans(KVState(), [11], [12], [])) == 2  # the worker goes on
    finally:
        runtime.shutdown()


def test_a_requests_prepare_steps_run_as_its_own_rows():
    """A prefix hit built by steps (a table assembly's form): the request runs each forward as
    one of its rows (counted in `forward_tokens`), then prefills the rest, and answers as with
    the same state handed over at once."""
    from headstart.engine.requests.generation import GenerationRequest
    from headstart.engine.runtime import EngineRuntime
    from headstart.engine.sched.extensions import Extension

    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_on_disk=False)
    try:
        prompt = runtime.prompt_for("world_1")
        ids = prompt.prompt_ids("How many cities are there?")
        head = ids[:40]

        def steps():
            state = KVState()
            yield Extension(state, head[:25])
            yield Extension(state, head[25:])
            return state

        def run(prepare):
            request = GenerationRequest(runtime.runner, prompt.decode, ids, SamplingParams(max_new_tokens=6),
                                        runtime.stop_ids, chunk_tokens=len(ids), prepare=prepare)
            before = runtime.worker.forward_tokens
            runtime.worker.enqueue(request, Priority.POOL, "request")
            return request.result(), runtime.worker.forward_tokens - before

        stepped, stepped_tokens = run(steps)
        at_once, at_once_tokens = run(lambda: runtime.runner.prefill(head))  # inline, uncounted
        assert stepped.token_ids == at_once.token_ids and len(stepped.token_ids) == 6
        assert stepped.cached_tokens_at_submit == at_once.cached_tokens_at_submit == len(head)
        assert stepped_tokens - at_once_tokens == len(head)
    finally:
        runtime.shutdown()


def test_worker_runs_by_priority():
    worker = ForwardWorker()
    gate, order = threading.Event(), []
    worker.enqueue(lambda: gate.wait() and False, Priority.STREAM, "blocker")
    for name, prio in [("stream", Priority.STREAM), ("pool", Priority.POOL), ("submit", Priority.SUBMIT),
                       ("flash", Priority.FLASH)]:
        worker.enqueue(lambda n=name: order.append(n) and False, prio, name)
    gate.set()
    worker.run_sync(lambda: None, Priority.STREAM)
    worker.shutdown()
    assert order == ["flash", "submit", "pool", "stream"]


def test_a_worker_bug_fails_its_jobs_and_the_worker_goes_on(monkeypatch):
    """The scheduler raising (a bug) fails the jobs that waited with its error, and a
    row returned by work that has no commit fails its own job: nobody is left waiting,
    and the worker runs the next job."""
    from headstart.engine.runner.rows import Row

    worker = ForwardWorker()
    try:
        real = worker.scheduler.schedule
        calls = []

        def broken_once(now):
            calls.append(now)
            if len(calls) == 1:
                raise RuntimeError("scheduler bug")
            return real(now)

        monkeypatch.setattr(worker.scheduler, "schedule", broken_once)
        with pytest.raises(RuntimeError, match="scheduler bug"):
            worker.enqueue(lambda: False, Priority.STREAM, "first").wait(10)
        rowless = worker.enqueue(lambda: Row(KVState(), [1]), Priority.STREAM, "no commit")
        with pytest.raises(NotImplementedError, match="no commit"):
            rowless.wait(10)
        assert worker.run_sync(lambda: "after", Priority.STREAM) == "after" and worker.is_alive()
    finally:
        worker.shutdown()


def test_worker_queue_bound():
    worker = ForwardWorker(max_queued=1)
    gate, started = threading.Event(), threading.Event()
    worker.enqueue(lambda: started.set() or (gate.wait() and False), Priority.STREAM)
    started.wait(10)  # the blocker runs: the queue is empty again
    worker.enqueue(lambda: False, Priority.STREAM)  # waits in the queue
    with pytest.raises(ResourceExhausted):
        worker.enqueue(lambda: False, Priority.STREAM)
    gate.set()
    worker.shutdown()


@pytest.mark.parametrize(("text", "error"), [
    (b"\xff\xfe", InvalidInput), ("\ud800", InvalidInput), ("x" * 11, TextTooLong), (42, InvalidInput),
])
def test_validate_text_errors(text, error):
    with pytest.raises(error):
        validate_text(text, max_chars=10)


def test_bad_input_leaves_session_usable(tiny_runtime):
    session = tiny_runtime.open_session("world_1")
    try:
        session.update(5, "How many")
        assert session.update(4, "stale snapshot") is False  # reordered: ignored
        for bad in (b"\xff", "x" * 10_000):
            with pytest.raises(InvalidInput):
                session.update(6, bad)
        with pytest.raises(StaleSequence):
            session.submit(3, "How many")
        with pytest.raises(PromptTooLong):
            session.submit(6, "ǅ" * 3900, SamplingParams(max_new_tokens=64))  # 7800 tokens
        result = session.submit(7, "How many cities?", SamplingParams(max_new_tokens=4)).result()
        assert result.token_ids == tiny_runtime.complete("world_1", "How many cities?", "cold", 4).token_ids
    finally:
        tiny_runtime.close_session(session.session_id)
    with pytest.raises(SessionClosed):
        session.update(9, "after close")


def test_session_table_evicts_idle_lru(tmp_path):
    from headstart.engine.runtime import EngineRuntime

    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float32", p0_cache_dir=tmp_path, max_sessions=2)
    try:
        a, b = runtime.open_session("world_1"), runtime.open_session("world_1")
        a.update(1, "x")
        a.wait_idle()
        c = runtime.open_session("world_1")  # b was used least recently
        assert (runtime.sessions.contains(a.session_id), runtime.sessions.contains(b.session_id)) == (True, False)
        assert b.closed and len(runtime.sessions) == 2 and runtime.sessions.evicted == 1
        stats = c.stats()  # a fresh session shares its P0: nothing private yet
        assert stats.memory_bytes == 0 and stats.shared_bytes == stats.cached_tokens * runtime.loaded.kv_bytes_per_token()
        a.wait_idle(speculation=True)  # answer-ahead steps extend a's cache meanwhile
        a_stats = a.stats()
        assert a_stats.memory_bytes + a_stats.shared_bytes == a_stats.cached_tokens * runtime.loaded.kv_bytes_per_token()
    finally:
        runtime.shutdown()


def test_urgent_job_preempts_typing_step_between_layers(tiny_runtime):
    """Another session's submit stops a typing extension in flight (it is
    queued again and the result stays exact)."""
    worker = tiny_runtime.worker
    session = tiny_runtime.open_session("world_1", "headstart")
    seen = threading.Event()
    layer0 = tiny_runtime.model.model.layers[0].input_layernorm  # runs inside the runner's loop, at layer 0

    def urgent_arrives(module, args):  # fires inside the typing forward
        if not seen.is_set():
            seen.set()
            worker.enqueue(lambda: False, Priority.SUBMIT, "other-submit")

    handle = layer0.register_forward_pre_hook(urgent_arrives)
    try:
        before = worker.preemptions
        session.update(1, "How many countries are there?")
        session.wait_idle()
    finally:
        handle.remove()
    try:
        assert seen.is_set() and worker.preemptions == before + 1
        assert session.aborted_extensions >= 1
        result = session.submit(2, "How many countries are there?", SamplingParams(max_new_tokens=6)).result()
        assert result.token_ids == tiny_runtime.complete("world_1", "How many countries are there?", "cold", 6).token_ids
    finally:
        tiny_runtime.close_session(session.session_id)


def _update_during_forward(runtime, session, first: str, second: str) -> None:
    """Send `first`, and `second` while the forward pass for `first` is inside
    its first decoder layer; then wait for the session to settle."""
    sent = threading.Event()
    layer0 = runtime.model.model.layers[0].input_layernorm  # runs inside the runner's loop, at layer 0

    def newer_snapshot(module, args):
        if not sent.is_set():
            sent.set()
            session.update(2, second)

    handle = layer0.register_forward_pre_hook(newer_snapshot)
    try:
        session.update(1, first)
        session.wait_idle()
    finally:
        handle.remove()
    assert sent.is_set()


@pytest.mark.parametrize("second, aborts", [
    ("How many countries are there in Eur", False),  # keeps the words in flight: the step finishes
    ("Which", True),  # keeps nothing the step adds: it stops between layers
])
def test_newer_snapshot_aborts_only_work_it_discards(tiny_runtime, second, aborts):
    """A keystroke must not abort an extension whose leading tokens survive
    (a typist faster than one forward would otherwise never be cached), and
    must abort one whose result would be cropped entirely. Both stay exact."""
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        _update_during_forward(tiny_runtime, session, "How many countries are there in E", second)
        assert (session.aborted_extensions > 0) == aborts
        result = session.submit(3, second, SamplingParams(max_new_tokens=6)).result()
        assert result.token_ids == tiny_runtime.complete("world_1", second, "cold", 6).token_ids
    finally:
        tiny_runtime.close_session(session.session_id)


def test_p0_store_caps_disk_entries(tmp_path, tiny_runtime):
    import os
    import time as _time

    store = P0Store(tmp_path, max_disk_entries=2)
    for i, name in enumerate("abc"):
        store.put(name * 64, tiny_runtime.runner.prefill([i + 1]))
        newest = tmp_path / f"p0-{name * 64}.safetensors"
        os.utime(newest, (_time.time() + i, _time.time() + i))  # distinct mtimes
    assert sorted(f.name[3:4] for f in tmp_path.glob("p0-*.safetensors")) == ["b", "c"]


def test_runtime_bounds_table_order_prompts(tiny_runtime, monkeypatch):
    import headstart.engine.runtime as runtime_module

    monkeypatch.setattr(runtime_module, "MAX_SUBSET_PROMPTS", 2)
    orders = [["city", "country"], ["country", "city"], ["countrylanguage", "city"]]
    for order in orders:
        tiny_runtime.prompt_for("world_1", order)
    subsets = [k for k in tiny_runtime._prompts if k[0] == "world_1" and k[1] is not None]
    assert subsets[-2:] == [("world_1", tuple(orders[1])), ("world_1", tuple(orders[2]))] and len(subsets) <= 2
    assert ("world_1", None) in tiny_runtime._prompts


def test_stream_jobs_run_least_recently_changed_first():
    worker = ForwardWorker()
    order = []
    gate = hold_worker(worker, Priority.STREAM, "blocker")
    for name, key in [("typing-now", 3.0), ("paused-longest", 1.0), ("paused", 2.0)]:
        worker.enqueue(Work(lambda n=name: order.append(n) and False, key=key), Priority.STREAM, name)
    worker.enqueue(lambda: order.append("unkeyed") and False, Priority.STREAM, "unkeyed")
    gate.set()
    worker.run_sync(lambda: None, Priority.IDLE)
    worker.shutdown()
    assert order == ["unkeyed", "paused-longest", "paused", "typing-now"]


def test_new_request_prefills_before_others_decode_steps(tiny_runtime, monkeypatch):
    """A request before its first token goes ahead of a request that is
    already decoding in the same class (TTFT first). Without batching, so the
    order is visible (with it, the order decides who fits a full group)."""
    worker, params = tiny_runtime.worker, SamplingParams(max_new_tokens=4)
    monkeypatch.setattr(worker, "max_batch_rows", 1)
    gate1 = hold_worker(worker, name="gate1")
    gate2, held = threading.Event(), threading.Event()
    first = tiny_runtime.start_complete("world_1", "How many countries?", "prefix", params)
    times: list[float] = []
    emit = first._emit

    def timed_emit(token):  # on the worker: hold it right after the first token
        times.append(time.perf_counter())
        if len(times) == 1:
            queue_gate(worker, gate2, held, name="gate2")
        return emit(token)

    first._emit = timed_emit
    gate1.set()
    assert held.wait(10)
    second = tiny_runtime.start_complete("world_1", "List the cities.", "prefix", SamplingParams(max_new_tokens=1))
    gate2.set()
    second.result(30)
    first.result(30)
    assert len(times) >= 2, "the first request must still be decoding when the second arrives"
    assert times[0] < second.first_token_at < times[1]


TYPING, DECODE, ALONE = {"type-a", "type-b"}, {"decode-f", "decode-g"}, {"submit-c", "ahead-d", "pool-e"}


@pytest.mark.parametrize(("scope", "groups"), [
    ("typing", [TYPING]),
    ("typing,decode", [TYPING, DECODE]),
    ("typing+decode", [TYPING | DECODE]),
    ("all", [TYPING | DECODE | ALONE]),
])
def test_batch_scopes_say_which_jobs_share_a_group(scope, groups):
    """Typing jobs of different sessions share a group in every scope;
    "typing,decode" batches decode steps among themselves, "typing+decode"
    with typing rows; only "all" batches a submit's prefill, answer-ahead
    and pool prefills."""
    worker = ForwardWorker(max_batch_rows=8, max_batch_tokens=64, batch_scope=scope)
    gate = hold_worker(worker)
    ran_with: dict[str, frozenset] = {}

    def step(name):
        def run():
            ran_with[name] = frozenset(job.name for job in worker._running)
            return False
        return run

    for name, priority, decoding in [("type-a", Priority.STREAM, False), ("type-b", Priority.STREAM, False),
                                     ("submit-c", Priority.SUBMIT, False), ("ahead-d", Priority.IDLE, False),
                                     ("pool-e", Priority.POOL, False), ("decode-f", Priority.SUBMIT, True),
                                     ("decode-g", Priority.POOL, True)]:
        worker.enqueue(Work(step(name), decoding=decoding), priority, name, owner=name)
    gate.set()
    worker.run_sync(lambda: None, Priority.IDLE)
    worker.shutdown()
    expected = {name: frozenset({name}) for name in TYPING | DECODE | ALONE}
    for group in groups:
        expected.update({name: frozenset(group) for name in group})
    assert ran_with == expected
    assert worker.batched_groups == len(groups)


def test_batch_scope_default_and_errors():
    assert ForwardWorker().batch_scope == "typing+decode"
    with pytest.raises(ValueError):
        ForwardWorker(batch_scope="everything")


def test_worker_and_scheduler_defaults_are_the_settings():
    """One place for a default: a worker or scheduler built without settings schedules as a
    replica built from the default settings does (issue 28: they said 1 / 8 / 0 where the
    settings say 8 rows, 32 stream typing tokens, 1000 ms deferral)."""
    from headstart.config import EngineSettings
    from headstart.engine.sched.scheduler import Scheduler
    from headstart.engine.sched.jobs import BatchScope

    settings = EngineSettings()
    for scheduler in (ForwardWorker().scheduler, Scheduler()):
        assert scheduler.max_batch_rows == settings.max_batch_rows == 8
        assert scheduler.max_batch_tokens == settings.max_batch_tokens
        assert scheduler.batch_scope == BatchScope.parse(settings.batch_scope)
        assert scheduler.decode_defer_s == settings.decode_defer_ms / 1000.0 == 1.0
        assert scheduler.stream_tokens == settings.stream_typing_tokens == 32
    worker = ForwardWorker()
    assert worker.max_queued == settings.max_queued_jobs


@pytest.mark.parametrize("defer_ms", [60_000, 0])
def test_a_new_submit_stops_a_decode_step_but_typing_does_not(defer_ms):
    """Deferred (behind typing) or not, a decode step in flight yields to a
    new submit's prefill; typing waits for it."""
    worker = ForwardWorker(decode_defer_ms=defer_ms)
    started, seen, job = threading.Event(), [], []

    def decode_step():
        started.set()
        deadline = time.monotonic() + 5
        while not job[0].preempt_requested and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append(job[0].preempt_requested)
        return False

    job.append(worker.enqueue(Work(decode_step, decoding=True), Priority.SUBMIT, "decode"))
    assert started.wait(5)
    worker.enqueue(lambda: False, Priority.STREAM, "typing")
    time.sleep(0.05)
    assert not job[0].preempt_requested  # typing waits for the decode step
    worker.enqueue(lambda: False, Priority.SUBMIT, "submit")
    worker.run_sync(lambda: None, Priority.IDLE)
    worker.shutdown()
    assert seen == [True]


def test_a_submit_whose_first_tokens_are_known_stops_no_decode_step():
    """A submit that needs no forward before its first decode step (its
    answer's first tokens were decoded ahead) asks no running row to stop:
    the rows would only run their forward again. One that needs a prefill
    still does (rule 5)."""
    worker = ForwardWorker()
    started, release, job = threading.Event(), threading.Event(), []

    def decode_step():
        started.set()
        release.wait(5)
        return False

    job.append(worker.enqueue(Work(decode_step, decoding=True), Priority.SUBMIT, "decode"))
    assert started.wait(5)
    worker.enqueue(lambda: False, Priority.SUBMIT, "known", needs_forward=False)
    assert not job[0].preempt_requested
    worker.enqueue(lambda: False, Priority.SUBMIT, "prefill")
    assert job[0].preempt_requested
    release.set()
    worker.run_sync(lambda: None, Priority.IDLE)
    worker.shutdown()


def test_a_sessions_submit_with_answer_tokens_ready_does_not_stop_a_streaming_answer(tiny_runtime, monkeypatch):
    """End to end: a session whose first answer tokens are known at submit
    enqueues a job that needs no forward first, so the answer streaming
    meanwhile is never asked to yield for it, and the session's answer is
    still the cold one."""
    worker = tiny_runtime.worker
    monkeypatch.setattr(worker, "max_batch_rows", 8)
    monkeypatch.setattr(worker, "batch_scope", "typing+decode")
    question = "How many countries are in Europe?"
    cold = tiny_runtime.complete("world_1", question, "cold", max_new_tokens=3).token_ids
    streaming = tiny_runtime.start_complete("world_1", "How many cities?", "prefix",
                                            SamplingParams(max_new_tokens=2000))
    session = tiny_runtime.open_session("world_1", "headstart")
    try:
        assert next(streaming.stream()) is not None
        session.update(1, question)
        deadline = time.monotonic() + 60
        while not session.ahead.tokens and time.monotonic() < deadline:
            time.sleep(0.001)
        assert session.ahead.tokens, "the session did not catch up"
        yields = streaming.decode_yields
        request = session.submit(2, question, SamplingParams(max_new_tokens=3))
        assert request.job is None or request.job.needs_forward is False
        assert request.result(60).token_ids == cold
        assert streaming.decode_yields == yields
    finally:
        streaming.cancel()
        tiny_runtime.close_session(session.session_id)


def test_a_decode_step_stopped_midway_runs_again_and_stays_exact(tiny_runtime):
    """A decode step whose job is asked to yield stops between layers with
    the cache unchanged, is queued again, and the answer equals the cold one."""
    worker = tiny_runtime.worker
    question = "How many countries?"
    cold = tiny_runtime.complete("world_1", question, "cold", max_new_tokens=5)
    tiny_runtime.complete("world_1", question, "prefix", max_new_tokens=1)  # P0 is at hand
    gate1 = hold_worker(worker, name="gate1")
    gate2, held = threading.Event(), threading.Event()
    request = tiny_runtime.start_complete("world_1", question, "prefix", SamplingParams(max_new_tokens=5))
    emit = request._emit

    def first_emit(token):  # on the worker, after the first token: hold it before the first decode step
        if not request.token_ids:
            queue_gate(worker, gate2, held, name="gate2")
        return emit(token)

    request._emit = first_emit
    gate1.set()
    assert held.wait(10)
    request.job.preempt_requested = True  # as a new submit would while the step runs
    gate2.set()
    assert request.result(30).token_ids == cold.token_ids
    assert request.decode_yields == 1


def test_decode_steps_wait_behind_typing_until_their_bound():
    """A decode step ranks behind typing prefill until it has waited
    `decode_defer_ms`; a prefill step, a FLASH decode step and an overdue
    decode step keep their class."""
    worker = ForwardWorker(decode_defer_ms=60_000)
    order: list[str] = []
    gate = hold_worker(worker)

    def step(name):
        return lambda: order.append(name) and False

    worker.enqueue(Work(step("decode"), decoding=True), Priority.SUBMIT, "decode")
    worker.enqueue(Work(step("flash-decode"), decoding=True), Priority.FLASH, "flash-decode")
    worker.enqueue(step("prefill"), Priority.SUBMIT, "prefill")
    worker.enqueue(step("typing"), Priority.STREAM, "typing")
    worker.enqueue(step("ahead"), Priority.IDLE, "ahead")
    gate.set()
    worker.run_sync(lambda: None, Priority.IDLE)
    assert order == ["flash-decode", "prefill", "typing", "decode", "ahead"]

    order.clear()
    worker.decode_defer_s = 0.05
    gate = hold_worker(worker)
    worker.enqueue(Work(step("decode"), decoding=True), Priority.SUBMIT, "decode")
    time.sleep(0.1)  # past its bound: the decode step takes its class back
    worker.enqueue(step("typing"), Priority.STREAM, "typing")
    gate.set()
    worker.run_sync(lambda: None, Priority.IDLE)
    worker.shutdown()
    assert order == ["decode", "typing"]


def test_typing_runs_between_another_requests_decode_steps(tiny_runtime, monkeypatch):
    """On the runtime's worker: a session's typing runs right after another
    request's first token, before its next decode step, and the request
    still streams its cold tokens."""
    worker = tiny_runtime.worker
    monkeypatch.setattr(worker, "decode_defer_s", 60.0)
    question = "How many countries?"
    cold = tiny_runtime.complete("world_1", question, "cold", max_new_tokens=6)
    tiny_runtime.complete("world_1", question, "prefix", max_new_tokens=1)  # P0 is at hand
    session = tiny_runtime.open_session("world_1")
    progress: list[float] = []
    session.on_progress = lambda *_: progress.append(time.perf_counter())
    try:
        gate = hold_worker(worker)
        request = tiny_runtime.start_complete("world_1", question, "prefix", SamplingParams(max_new_tokens=6))
        tokens: list[float] = []
        emit = request._emit
        request._emit = lambda token: tokens.append(time.perf_counter()) or emit(token)
        session.update(1, "Which cities are big?")
        gate.set()
        assert request.result(30).token_ids == cold.token_ids
        session.wait_idle(30)
        assert len(tokens) >= 2 and progress
        assert tokens[0] < progress[0] < tokens[1]
    finally:
        tiny_runtime.close_session(session.session_id)


def test_the_shortest_waiting_prefill_runs_first(tiny_runtime):
    """Among requests before their first token, the one with the fewest
    tokens to compute goes first (its key is read when the worker pops)."""
    worker = tiny_runtime.worker
    tiny_runtime.complete("world_1", "warm", "prefix", max_new_tokens=1)  # P0 is at hand
    gate = hold_worker(worker)
    params = SamplingParams(max_new_tokens=1)
    long = tiny_runtime.start_complete(
        "world_1", "List every country with its capital, population and continent, sorted by name.", "prefix", params)
    short = tiny_runtime.start_complete("world_1", "Countries?", "prefix", params)
    assert 0 < short.order_key() < long.order_key() < 1
    gate.set()
    long.result(30)
    short.result(30)
    assert short.first_token_at < long.first_token_at
    assert short.order_key() == 1.0  # prefilled: behind every waiting prefill


def test_typing_order_is_read_when_popped():
    """A queued job's key can change (its user typed again): the pop uses the key now."""
    worker = ForwardWorker()
    order, keys = [], {"a": 1.0, "b": 2.0}
    gate = hold_worker(worker, Priority.STREAM, "blocker")
    for name in "ab":
        worker.enqueue(Work(lambda n=name: order.append(n) and False, key=lambda n=name: keys[n]), Priority.STREAM, name)
    keys["a"] = 3.0  # a typed again after being queued
    gate.set()
    worker.run_sync(lambda: None, Priority.IDLE)
    worker.shutdown()
    assert order == ["b", "a"]


def _states_for_rows(runtime):
    runner = runtime.runner
    prompt = runtime.prompt_for("world_1")
    a = prompt.prompt_ids("How many cities")
    b = prompt.prompt_ids("List the names of countries")
    return runner, [runner.prefill(a[:-3]), runner.prefill(b[:-1]), KVState()], [a[-3:], b[-1:], a[:5]]


def test_extend_rows_equals_lone_extensions(tiny_runtime):
    """Rows of different cache lengths (one empty) and token counts, with and
    without logits: each equals its lone extension (float64, to rounding)."""
    from headstart.engine.runner.rows import Row

    runner, states, news = _states_for_rows(tiny_runtime)
    lone = [s.copy() for s in states]
    for state, new in zip(lone, news):
        runner.extend(state, new)
    wants = [True, False, True]
    batched = [s.copy() for s in states]
    calls = [Row(s, n, w, None) for s, n, w in zip(batched, news, wants)]
    assert runner.extend_rows(calls) == [True, True, True]
    for one, many, want in zip(lone, batched, wants):
        assert one.ids == many.ids
        for la, lb in zip(one.cache.layers, many.cache.layers):
            assert la.keys.shape == lb.keys.shape
            assert torch.allclose(la.keys, lb.keys, atol=1e-12) and torch.allclose(la.values, lb.values, atol=1e-12)
        if want:
            assert torch.allclose(one.last_logits, many.last_logits, atol=1e-10)
        else:
            assert many.last_logits is None


def _assert_same_state(one: KVState, other: KVState) -> None:
    assert one.ids == other.ids
    for la, lb in zip(one.cache.layers, other.cache.layers):
        assert la.keys.shape == lb.keys.shape
        assert torch.allclose(la.keys, lb.keys, atol=1e-12) and torch.allclose(la.values, lb.values, atol=1e-12)
    assert (one.last_logits is None) == (other.last_logits is None)
    if one.last_logits is not None:
        assert torch.allclose(one.last_logits, other.last_logits, atol=1e-10)


def test_extend_rows_drops_the_rows_that_ask(tiny_runtime):
    """A row whose `should_abort` asks leaves the batched forward (its state
    untouched) and the others finish, equal to their lone extensions; the
    forward stops only when every row asks."""
    from headstart.engine.runner.rows import Row

    runner, states, news = _states_for_rows(tiny_runtime)
    assert len(runner.model.model.layers) >= 2
    lone = [s.copy() for s in states]
    for state, new in zip(lone, news):
        runner.extend(state, new)

    def run(checks):
        rows = [s.copy() for s in states]
        calls = [Row(s, n, True, check) for s, n, check in zip(rows, news, checks)]
        return runner.extend_rows(calls), rows

    done, rows = run([lambda: True] * 3)
    assert done == [False, False, False]
    for before, after in zip(states, rows):
        assert after.ids == before.ids and after.nbytes() == before.nbytes()  # untouched

    done, rows = run([lambda: True, None, lambda: True])  # leave before the first layer
    assert done == [False, True, False]
    _assert_same_state(lone[1], rows[1])
    assert rows[0].ids == states[0].ids and rows[2].ids == states[2].ids

    polls = itertools.count()
    done, rows = run([None, lambda: next(polls) >= 1, None])  # the middle row leaves before the second layer
    assert done == [True, False, True]
    assert next(polls) == 2  # polled before layers 0 and 1, then gone
    _assert_same_state(lone[0], rows[0])
    _assert_same_state(lone[2], rows[2])
    assert rows[1].ids == states[1].ids and rows[1].nbytes() == states[1].nbytes()


def test_worker_groups_jobs_of_different_owners_and_batches_their_forwards(tiny_runtime):
    """One group: two owners' rows (prepared by their steps without running
    the model) share one forward on the worker thread, a second job of an
    owner waits for the next group, a step without a forward and a failing
    step are reported as lone steps would be, and each row's commit gets its
    result and says whether its job goes on."""
    from headstart.engine.runner.rows import Row

    runner = tiny_runtime.runner
    worker = ForwardWorker(max_batch_rows=8, max_batch_tokens=64, batch_scope="all")
    gate = hold_worker(worker)
    states = {name: runner.prefill([1, 2, 3]) for name in "ab"}
    groups: list[int] = []
    committed: dict[str, tuple] = {}

    def extending(name):
        def step():
            groups.append(worker.batched_groups)
            return Row(states[name], [4, 5], runner=runner)

        def commit(row, result):
            committed[name] = (result.ran, result.error, worker.on_worker_thread())
            return False

        return Call(step, commit)

    def failing():
        raise ValueError("boom")

    jobs = [worker.enqueue(extending("a"), Priority.STREAM, "a1", owner="a"),
            worker.enqueue(extending("b"), Priority.SUBMIT, "b", owner="b"),
            worker.enqueue(lambda: False, Priority.IDLE, "c", owner="c"),
            worker.enqueue(failing, Priority.STREAM, "d", owner="d")]
    second_a = worker.enqueue(lambda: groups.append(-1) or False, Priority.STREAM, "a2", owner="a")
    gate.set()
    for job in jobs[:3]:
        job.wait(10)
    with pytest.raises(ValueError):
        jobs[3].wait(10)
    second_a.wait(10)
    worker.shutdown()
    assert worker.batched_groups >= 1 and worker.batched_forwards == 1 and worker.batched_rows == 2
    assert groups[:2] == [0, 0] and groups[2] == -1  # a2 ran after a1's group
    assert committed == {"a": (True, None, True), "b": (True, None, True)}
    reference = runner.prefill([1, 2, 3, 4, 5])
    for state in states.values():
        assert state.ids == [1, 2, 3, 4, 5]
        assert torch.allclose(state.last_logits, reference.last_logits, atol=1e-10)


def test_rows_over_the_token_budget_run_in_successive_forwards(tiny_runtime):
    """Rows whose real token counts exceed `max_batch_tokens` split into
    forwards in plan order (the most urgent first), each within the budget;
    a row with nothing to extend joins none and still commits."""
    from headstart.engine.runner.rows import Row
    from headstart.engine.sched.forwards import pack_forwards, run_rows

    runner = tiny_runtime.runner
    states = [runner.prefill([1, 2, 3]) for _ in range(4)]
    rows = [Row(state, ids, runner=runner) for state, ids in zip(states, [[4, 5, 6], [7, 8], [], [9, 10, 11]])]
    assert [[rows.index(r) for r in f] for f in pack_forwards(rows, 5)] == [[0, 1], [3]]
    results, sizes = run_rows(rows, 5)
    assert sizes == [2, 1] and all(r.ran and r.error is None for r in results)
    assert [s.ids for s in states] == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8], [1, 2, 3], [1, 2, 3, 9, 10, 11]]


def test_groups_fit_the_token_budget():
    """Jobs join a group in scheduling order while their cost hints fit
    `max_batch_tokens`; one that does not fit waits, a smaller one after it joins."""
    worker = ForwardWorker(max_batch_rows=8, max_batch_tokens=64)
    gate = hold_worker(worker)
    seen: dict[str, int] = {}

    def step(name):
        return lambda: seen.setdefault(name, worker.batched_groups) and False

    for name, cost in [("big", 40), ("too-big", 30), ("small", 10), ("tiny", 1)]:
        worker.enqueue(Work(step(name), cost=cost), Priority.STREAM, name, owner=name)
    gate.set()
    worker.run_sync(lambda: None, Priority.IDLE)
    worker.shutdown()
    first = seen["big"]
    assert seen["small"] == seen["tiny"] == first and seen["too-big"] != first


def test_a_submit_keeps_only_its_own_typing_row_in_a_group(tiny_runtime, monkeypatch):
    """A submit that arrives while its session's typing row shares a batched
    forward: the other session's row leaves the batch at the next layer, its
    own row finishes alone, and both answers still equal their cold runs."""
    from headstart.engine.runner import decoder_loop

    worker = tiny_runtime.worker
    monkeypatch.setattr(worker, "max_batch_rows", 8)
    monkeypatch.setattr(worker, "batch_scope", "typing,decode")
    qa, qb = "How many cities are there?", "List every country name"
    params = SamplingParams(max_new_tokens=3)
    cold_a = tiny_runtime.complete("world_1", qa, "cold", max_new_tokens=3).token_ids
    cold_b = tiny_runtime.complete("world_1", qb, "cold", max_new_tokens=3).token_ids
    a, b = tiny_runtime.open_session("world_1"), tiny_runtime.open_session("world_1")
    plans, submits = [], []
    rows_leaving = decoder_loop._rows_leaving

    def submit_during_the_group(live, calls):
        if len(live.running) == 2 and not submits:  # on the worker, before the group's first layer
            plans.append(live)
            submits.append(a.submit(2, qa, params))
        return rows_leaving(live, calls)

    monkeypatch.setattr(decoder_loop, "_rows_leaving", submit_during_the_group)
    try:
        gate = hold_worker(worker)
        a.update(1, qa)
        b.update(1, qb)
        gate.set()
        deadline = time.monotonic() + 30
        while not submits and time.monotonic() < deadline:
            time.sleep(0.01)
        assert submits, "the two typing rows never shared a forward"
        assert submits[0].result(30).token_ids == cold_a
        assert len(plans[0].running) == 1  # the other row left; the submitting session's row finished
        b.wait_idle(30)
        assert b.submit(2, qb, params).result(30).token_ids == cold_b
    finally:
        tiny_runtime.close_session(a.session_id)
        tiny_runtime.close_session(b.session_id)


@pytest.mark.parametrize("fit", [1, 3])
def test_kv_budget_evicts_idle_sessions_then_refuses(fit):
    """A KV byte budget with room for P0 and `fit` sessions' reserves: a
    session more evicts the least recently used idle one; when every session
    is busy the open fails with RESOURCE_EXHAUSTED and the others go on."""
    from headstart.engine.runtime import EngineRuntime

    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float32", p0_cache_on_disk=False,
                                          answer_ahead_tokens=0, kv_session_reserve_tokens=64)
    try:
        per_token = runtime.loaded.kv_bytes_per_token()
        p0_bytes = len(runtime.prompt_for("world_1").base_ids) * per_token
        runtime.kv_memory.budget_bytes = p0_bytes + (fit + 1) * 64 * per_token - 1  # room for `fit` sessions
        sessions = [runtime.open_session("world_1") for _ in range(fit)]
        usage = runtime.sessions.kv_usage()
        assert (usage.shared_bytes, usage.session_bytes, usage.num_sessions) == (p0_bytes, 0, fit)
        assert usage.free_bytes == runtime.kv_memory.budget_bytes - p0_bytes
        extra = runtime.open_session("world_1")  # evicts sessions[0], the least recently used
        assert sessions[0].closed and runtime.sessions.evicted == 1 and len(runtime.sessions) == fit
        gate = hold_worker(runtime.worker)
        try:
            busy = sessions[1:] + [extra]
            for s in busy:
                s.update(1, "How many")  # queued behind the gate: not idle
            with pytest.raises(ResourceExhausted, match="KV budget full"):
                runtime.open_session("world_1")
        finally:
            gate.set()
        for s in busy:
            s.wait_idle()
        usage = runtime.sessions.kv_usage()
        assert usage.session_bytes == sum(s.stats().memory_bytes for s in busy) > 0
        assert usage.shared_bytes == p0_bytes  # P0 once, however many sessions read it
    finally:
        runtime.shutdown()


def test_forward_trace_records_each_iteration(tmp_path):
    """HEADSTART_TRACE_FORWARDS: a line per worker iteration naming the jobs
    that ran, their new tokens and cache lengths, and the iteration's time."""
    import json

    from headstart.engine.runtime import EngineRuntime

    path = tmp_path / "trace" / "forwards.jsonl"
    runtime = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_dir=tmp_path,
                                          trace_forwards=path, answer_ahead_tokens=0)
    try:
        session = runtime.open_session("world_1")
        session.update(1, "how many singers")
        session.wait_idle(60)  # the typing step runs before the submit can supersede it
        request = session.submit(2, "how many singers are there?", SamplingParams(max_new_tokens=3))
        tokens = request.result(timeout=60).token_ids
    finally:
        runtime.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [row for line in lines for row in line["rows"]]
    assert all(line["ms"] >= 0 and line["waiting"] >= 0 for line in lines)
    typing = [row for row in rows if row[0].startswith("type:") and row[3] > 0]
    assert typing and all(row[4] > 0 for row in typing)  # extended a cache already holding P0
    # the answer's decode steps ran one new token each, on a cache that grows by one
    decode = [row for row in rows if row[0].startswith("submit") and row[3] == 1]
    assert len(decode) >= len(tokens) - 1
    assert [row[4] for row in decode] == sorted(row[4] for row in decode)
