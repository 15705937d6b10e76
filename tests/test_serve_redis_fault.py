"""Integration: Redis stopped and restarted under the serving stack.

An engine app of its own on the session's Ray Serve (one replica, random:tiny
float64, the pfk table cache on a private real Redis, no device tier, so every
block is read from Redis) behind a gateway of its own. With Redis down, every
request is still answered, its tables computed (the same tokens as a cold
run), and a typing session goes on: every acknowledged snapshot is in the
submitted prompt. A restarted Redis is empty (no persistence); once the blocks
are precomputed again (`headstart tables precompute`, here from the test
process) the replica reads them again: the answer computed at submit shrinks
back and equals the answer before the outage.
"""

from __future__ import annotations

import time

import pytest

from headstart.client import HeadstartClient
from tests.serve_fixture import own_engine_app
from tests.typing_traces import typed

pytestmark = pytest.mark.slow
APP = "headstart-engine-tables"
DB, QUESTION = "concert_singer", "How many concerts are there in each stadium?"
ORDER = ["singer_in_concert", "concert", "stadium", "singer"]
MAX_NEW = 8
RETRY_AFTER_S = 5.0  # FallbackStore's default pause after a Redis error


def _settings(redis_url: str, p0_dir):
    from headstart.config import EngineSettings

    return EngineSettings(model="random:tiny", dtype="float64", threads=1, chunk_tokens=64, debounce_ms=0.0,
                          p0_cache_dir=p0_dir, table_cache="pfk", table_store_url=redis_url, table_device_bytes=0)


@pytest.fixture
def tables_gateway(serve_engine, redis_restartable, tmp_path):
    settings = _settings(redis_restartable.url, tmp_path / "p0")
    with own_engine_app(serve_engine, APP, settings) as gateway:
        yield f"127.0.0.1:{gateway.grpc_port}"


def _precompute(redis_url: str, p0_dir) -> int:
    """What an operator runs after a Redis restart: encode the database's blocks again."""
    from headstart.build import build_runtime

    runtime = build_runtime(_settings(redis_url, p0_dir).model_copy(update={"table_precompute_on_open": False}))
    try:
        return runtime.prefix_source.precompute(DB).num_groups_encoded
    finally:
        runtime.shutdown()


def test_redis_restart_falls_back_to_compute_and_comes_back(tables_gateway, redis_restartable, tmp_path):
    with HeadstartClient(tables_gateway, token="tok-alice") as client:
        cold = client.complete(DB, QUESTION, MAX_NEW, mode="cold", tables=ORDER)
        whole_schema = client.complete(DB, QUESTION, MAX_NEW, mode="cold")  # the prompt a session submits
        with_blocks = client.complete(DB, QUESTION, MAX_NEW, tables=ORDER)  # blocks encoded on first use
        assert with_blocks.computed_tokens_at_submit < cold.computed_tokens_at_submit
        session = client.typing(DB)
        half = len(QUESTION) // 2
        for text in typed(QUESTION[:half]):
            session.input(text)
        session.wait_caught_up()

        redis_restartable.stop()
        down = client.complete(DB, QUESTION, MAX_NEW, tables=ORDER)
        assert list(down.token_ids) == list(cold.token_ids)  # every table computed: a full prefill
        assert down.computed_tokens_at_submit > with_blocks.computed_tokens_at_submit
        for text in typed(QUESTION[half:], QUESTION[:half]):
            session.input(text)
        typed_answer = session.submit(QUESTION, MAX_NEW)
        session.close()
        # nothing acknowledged was lost: the submitted prompt is the whole typed question
        assert typed_answer.prompt_tokens == whole_schema.prompt_tokens
        assert len(typed_answer.token_ids) == MAX_NEW

        redis_restartable.start()  # empty: nothing was persisted
        assert _precompute(redis_restartable.url, tmp_path / "p0-op") >= 1
        time.sleep(RETRY_AFTER_S + 0.5)  # the replica's store tries Redis again after its pause
        back = client.complete(DB, QUESTION, MAX_NEW, tables=ORDER)
        if back.computed_tokens_at_submit != with_blocks.computed_tokens_at_submit:
            back = client.complete(DB, QUESTION, MAX_NEW, tables=ORDER)  # the first call re-closed the circuit
    assert list(back.token_ids) == list(with_blocks.token_ids)
    assert back.computed_tokens_at_submit == with_blocks.computed_tokens_at_submit
