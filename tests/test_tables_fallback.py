"""Blocks in a real Redis: shared with a second engine, and when Redis goes down every request
is still served (its tables computed instead), and blocks are used again once it is back."""

from __future__ import annotations

import pytest

from headstart.build import build_runtime
from headstart.config import EngineSettings
from headstart.engine.requests.generation import SamplingParams
from headstart.engine.kv.p0_store import p0_key
from headstart.engine.runtime import EngineRuntime
from headstart.models import load_model
from headstart.tables.device_tier import DeviceTier
from headstart.tables.service import TableCacheService
from headstart.tables.store import FallbackStore, open_store

DB, QUESTION = "concert_singer", "How many concerts are there in each stadium?"
ORDER = ("singer_in_concert", "concert", "stadium", "singer")


@pytest.fixture(scope="module")
def loaded():
    return load_model("random:tiny", "float64")


def engine(loaded, url: str) -> EngineRuntime:
    """A runtime on `url` with no device tier (every block is read from the store) and no retry pause."""
    service = TableCacheService(loaded, mode="pfk", store=open_store(url, retry_after_s=0.0), tier=DeviceTier(0))
    settings = EngineSettings(model="random:tiny", dtype="float64", table_cache="pfk", p0_cache_on_disk=False,
                              table_precompute_on_open=False)
    return build_runtime(settings, loaded, service=service)


def test_blocks_written_by_one_engine_serve_another(loaded, redis_url):
    writer, reader = engine(loaded, redis_url), engine(loaded, redis_url)
    try:
        report = writer.prefix_source.precompute(DB)
        assert report.num_tables == 4
        result = reader.complete(DB, QUESTION, max_new_tokens=6, tables=ORDER)
        stats = reader.prefix_source.service.stats()
        assert (stats["num_store_hits"], stats["num_misses"]) == (4, 0)
        assert stats["bytes_from_store"] == report.num_bytes_stored
        assert result.token_ids == writer.complete(DB, QUESTION, max_new_tokens=6, tables=ORDER).token_ids
    finally:
        writer.shutdown()
        reader.shutdown()


def test_redis_down_computes_instead_and_recovers(loaded, redis_restartable):
    rt = engine(loaded, redis_restartable.url)
    try:
        rt.prefix_source.precompute(DB)
        with_blocks = rt.complete(DB, QUESTION, max_new_tokens=6, tables=ORDER)
        cold = rt.complete(DB, QUESTION, "cold", 6, tables=ORDER)

        redis_restartable.stop()
        down = rt.complete(DB, QUESTION, max_new_tokens=6, tables=ORDER)
        assert down.token_ids == cold.token_ids  # every table computed: a full prefill
        assert down.cached_tokens_at_submit == len(rt.prefix_source.layout(DB).head_ids)
        session = rt.open_session(DB, "headstart")  # P0 without blocks: computed, not kept
        try:
            assert len(session.submit(1, QUESTION, SamplingParams(max_new_tokens=2)).result().token_ids) == 2
        finally:
            rt.close_session(session.session_id)
        base_ids = rt.prompt_for(DB).base_ids
        key = p0_key(f"{loaded.model_id}|tables=pfk", "float64", base_ids)
        assert rt.p0_store.get(key, loaded.device) is None
        store = rt.prefix_source.service.store
        assert isinstance(store, FallbackStore) and store.num_errors > 0
        assert rt.prefix_source.service.stats()["num_misses"] == 8  # 4 tables, twice (the request, then P0)

        redis_restartable.start()  # empty again: nothing was persisted
        assert rt.prefix_source.precompute(DB).num_groups_encoded == 1
        back = rt.complete(DB, QUESTION, max_new_tokens=6, tables=ORDER)
        assert back.token_ids == with_blocks.token_ids
        assert back.cached_tokens_at_submit == with_blocks.cached_tokens_at_submit
        rt.base_state(rt.prompt_for(DB))
        assert rt.p0_store.get(key, loaded.device) is not None  # with every block, P0 is kept
    finally:
        rt.shutdown()
