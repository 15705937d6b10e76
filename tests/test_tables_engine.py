"""The engine with the table cache on (float64 random:tiny): completions over any table order
compute only the question, sessions start from an assembled P0 and keep the anticipatory
exactness guarantee against a cold run over that same P0, batches rerank and pipeline."""

from __future__ import annotations

import random

import pytest
import torch

from headstart.build import build_runtime
from headstart.config import EngineSettings
from headstart.engine.errors import InvalidInput
from headstart.engine.requests.generation import GenerationRequest, SamplingParams
from headstart.engine.kv.p0_store import p0_key
from headstart.engine.runtime import EngineRuntime
from headstart.engine.sched.jobs import Priority
from headstart.tables.batch import BatchItem, serve_batch
from headstart.tables.engine_source import table_source
from tests.typing_traces import KINDS, QUESTIONS

MAX_NEW = 10
PARAMS = SamplingParams(max_new_tokens=MAX_NEW)
TABLES = ("stadium", "singer", "concert", "singer_in_concert")


@pytest.fixture(scope="module", params=["pfk", "independent"])
def runtime(request, tmp_path_factory):
    rt = build_runtime(model="random:tiny", dtype="float64", table_cache=request.param,
                                     p0_cache_dir=tmp_path_factory.mktemp("p0"), chunk_tokens=64, debounce_ms=0.0)
    yield rt
    rt.shutdown()


def from_base(rt: EngineRuntime, db: str, question: str) -> list[int]:
    """The reference: a cold run of the question over the same assembled P0."""
    prompt = rt.prompt_for(db)
    base = rt.base_state(prompt)
    ids = prompt.prompt_ids(question)
    request = GenerationRequest(rt.runner, prompt.decode, ids, PARAMS, rt.stop_ids, chunk_tokens=len(ids),
                                prepare=base.copy)
    rt.worker.enqueue(request, Priority.POOL)
    return request.result().token_ids


@pytest.mark.parametrize("order", [TABLES, TABLES[::-1], ("singer_in_concert", "singer"), ("stadium",)])
def test_complete_over_tables_in_any_order_computes_only_the_question(runtime, order):
    layout = runtime.prefix_source.layout("concert_singer")
    result = runtime.complete("concert_singer", QUESTIONS[0], max_new_tokens=MAX_NEW, tables=order)
    cached = len(layout.head_ids) + sum(len(layout.texts[t].ids) for t in order)
    assert (result.cached_tokens_at_submit, result.computed_tokens_at_submit) == \
        (cached, result.prompt_tokens - cached)
    assert len(result.token_ids) == MAX_NEW
    assert runtime.prefix_source.service.tier.protected_bytes == 0


def test_schema_order_matches_cold_in_pfk(runtime):
    """concert_singer's group order is its schema order: pfk assembly equals a prefill (up to
    float64 rounding), so the tokens equal a cold run's; independent blocks lose attention."""
    table = runtime.complete("concert_singer", QUESTIONS[0], max_new_tokens=MAX_NEW, tables=TABLES)
    cold = runtime.complete("concert_singer", QUESTIONS[0], "cold", MAX_NEW, tables=TABLES)
    if runtime.prefix_source.service.mode == "pfk":
        assert table.token_ids == cold.token_ids
    else:
        assert table.token_ids != cold.token_ids


@pytest.mark.parametrize("db", ["concert_singer", "pets_1"])
def test_whole_schema_matches_cold_in_pfk(runtime, db):
    """A whole-schema prompt of a one-group database is its group's encode sequence (schema
    order, even where the topological order differs: pets_1, issue 30): tokens equal cold's."""
    table = runtime.complete(db, QUESTIONS[0], max_new_tokens=MAX_NEW)
    cold = runtime.complete(db, QUESTIONS[0], "cold", MAX_NEW)
    if runtime.prefix_source.service.mode == "pfk":
        assert table.token_ids == cold.token_ids
    else:
        assert table.token_ids != cold.token_ids


def test_p0_is_assembled_and_kept_under_a_table_key(runtime):
    prompt = runtime.prompt_for("flight_2")
    base = runtime.base_state(prompt)
    assert base.ids == prompt.base_ids
    reference = runtime.worker.run_sync(lambda: runtime.runner.prefill(prompt.base_ids))
    diff = max(float((a.keys - b.keys).abs().max()) for a, b in zip(base.cache.layers, reference.cache.layers))
    # flight_2 is two groups, (airlines,) and (airports, flights): airports' block never saw
    # airlines, which the prompt lists first, so the assembled P0 is not the prefill's
    assert diff > 1e-3
    mode = runtime.prefix_source.service.mode
    loaded = runtime.loaded
    assert runtime.p0_store.get(p0_key(f"{loaded.model_id}|tables={mode}", "float64", prompt.base_ids),
                                loaded.device) is base
    assert runtime.p0_store.get(p0_key(loaded.model_id, "float64", prompt.base_ids), loaded.device) is None


@pytest.mark.parametrize("kind", ["typos", "mid_edit"])
@pytest.mark.parametrize("policy", ["headstart", "paper"])
@pytest.mark.parametrize("pace", ["fast", "slow"])
def test_session_matches_a_cold_run_over_the_same_assembled_p0(runtime, kind, policy, pace):
    rng = random.Random(f"{kind}-{policy}-{pace}")
    question = QUESTIONS[rng.randrange(len(QUESTIONS))]
    snapshots = KINDS[kind](question, rng)
    session = runtime.open_session("flight_2", policy)  # its assembled P0 is not the prefill's
    try:
        for seq, text in enumerate(snapshots, 1):
            session.update(seq, text)
            if pace == "slow":
                session.wait_idle()
        result = session.submit(len(snapshots) + 1, snapshots[-1], PARAMS).result()
    finally:
        runtime.close_session(session.session_id)
    expected = from_base(runtime, "flight_2", snapshots[-1])
    assert len(expected) == MAX_NEW
    assert result.token_ids == expected


@pytest.mark.parametrize("rerank", [True, False])
@pytest.mark.parametrize("pipeline", [True, False])
def test_batch_serves_every_item_as_a_single_completion_would(runtime, rerank, pipeline):
    rng = random.Random(7)
    items = [BatchItem(db, q, tuple(rng.sample(tables, len(tables))))
             for db, tables in (("concert_singer", list(TABLES)), ("world_1", ["city", "country", "countrylanguage"]))
             for q in QUESTIONS[:3]]
    rng.shuffle(items)
    results = serve_batch(runtime, items, SamplingParams(max_new_tokens=4), rerank=rerank, pipeline=pipeline)
    assert [r.index for r in results] == list(range(len(items)))
    assert sorted(r.position for r in results) == list(range(len(items)))
    for item, r in zip(items, results):
        single = runtime.complete(item.db, item.question, max_new_tokens=4, tables=item.tables)
        assert r.result.token_ids == single.token_ids
        assert r.tables == item.tables and r.missing == () and r.ttft_ms > 0
    positions = [r.index for r in sorted(results, key=lambda r: r.position)]
    dbs = [items[i].db for i in positions]
    switches = sum(a != b for a, b in zip(dbs, dbs[1:]))
    if rerank:
        assert switches == 1  # all of one database, then all of the other
    else:
        assert positions == list(range(len(items)))
    assert runtime.prefix_source.service.tier.protected_bytes == 0


@pytest.mark.parametrize("tables,message", [
    ([], "distinct tables"), (["singer", "Singer"], "distinct tables"), (["singer", "nope"], "no table 'nope'"),
])
def test_bad_table_lists_are_invalid_input(runtime, tables, message):
    with pytest.raises(InvalidInput, match=message):
        runtime.complete("concert_singer", "q", max_new_tokens=1, tables=tables)


def test_a_table_cache_setting_needs_the_table_source():
    settings = EngineSettings(model="random:tiny", dtype="float64", table_cache="pfk", p0_cache_on_disk=False)
    with pytest.raises(InvalidInput, match="build_runtime"):
        EngineRuntime(settings)


def test_table_calls_need_the_table_cache(tmp_path):
    rt = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_on_disk=False)
    try:
        with pytest.raises(InvalidInput, match="table cache is off"):
            table_source(rt).precompute("concert_singer")
        assert rt.complete("concert_singer", "q", max_new_tokens=2, tables=["singer"]).prompt_tokens > 0
    finally:
        rt.shutdown()


def test_block_tensors_are_not_written_by_sessions(runtime):
    layout = runtime.prefix_source.layout("world_1")
    block = runtime.prefix_source.service.store.get(layout.scope.block_id("city"))
    before = block.keys_pre_rope.clone()
    session = runtime.open_session("world_1", "headstart")
    try:
        session.update(1, QUESTIONS[0])
        session.submit(2, QUESTIONS[0], SamplingParams(max_new_tokens=2)).result()
    finally:
        runtime.close_session(session.session_id)
    assert torch.equal(block.keys_pre_rope, before)


def test_a_table_p0_is_assembled_in_planned_rows():
    """A table-block P0's forwards (the shared head, the spans between blocks) are rows the
    worker plans and counts as shared work, not an opaque `run_sync` step; the P0 is the same
    as `service.assemble` run inline."""
    rt = build_runtime(model="random:tiny", dtype="float64", table_cache="pfk", p0_cache_on_disk=False)
    try:
        source, db = rt.prefix_source, "concert_singer"
        source.precompute(db)
        prompt = rt.prompt_for(db)
        service = source.service
        before, shared_before, tokens_before = service.stats(), rt.worker.shared_tokens, rt.worker.forward_tokens
        state = source.base_state(db, prompt)
        after = service.stats()
        head = len(source.layout(db).head_ids)
        computed = after["num_computed_tokens"] - before["num_computed_tokens"]
        assert computed > 0 and after["num_head_tokens"] - before["num_head_tokens"] == head
        # the head's forward (first use of the layout) and every computed span, as shared rows
        assert rt.worker.shared_tokens - shared_before == head + computed
        assert rt.worker.forward_tokens == tokens_before  # not a client's work
        blocks = service.load(service.plan(source.layout(db), prompt.base_ids))
        try:
            inline, _ = rt.worker.run_sync(lambda: service.assemble(blocks, rt.runner, compute_tail=True))
        finally:
            service.release(blocks)
        assert inline.ids == state.ids and torch.equal(inline.last_logits, state.last_logits)
        for ours, theirs in zip(state.cache.layers, inline.cache.layers):
            assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    finally:
        rt.shutdown()
