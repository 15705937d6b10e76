"""The trained Qwen2.5-Coder-0.5B-Instruct, as served (quantized GGUF weights, float32
activations): anticipation stays exact where near-ties are real, and a plain question
gets SQL that runs and answers it.
"""

from __future__ import annotations

import sqlite3

import pytest
import torch

from headstart.eval.extract import extract_sql
from headstart.kernels import cpu_isa
from headstart.kernels import quant as qk
from headstart.models.catalogue import CATALOGUE, SMALL_MODEL
from headstart.models.gguf_model import packed_bytes
from headstart.paths import default_spider_dir
from headstart.replay_modes import replay_in_mode
from headstart.typist import Typist
from tests.engine_fixture import typed_then_submitted

pytestmark = pytest.mark.skipif(not cpu_isa.supported(), reason="the quantized kernels need x86-64 with AVX2")


@pytest.fixture(scope="module")
def real(trained_runtime):
    return trained_runtime


def test_served_quantized_within_the_memory_bar(real):
    assert real.loaded.weights == f"quantized:{cpu_isa.select().name}"
    assert real.fast_path == "quant"
    # the weights a replica holds: at most 1.5 x the GGUF file (the bar; 1.11 x measured)
    assert packed_bytes(real.model) <= 1.5 * CATALOGUE[SMALL_MODEL].file_size


@pytest.mark.parametrize("db, question", [
    ("concert_singer", "How many singers do we have?"),
    ("world_1", "What are the names of the countries in Asia with a population above 100 million?"),
])
def test_typed_then_submitted_equals_cold(real, db, question):
    cold = real.complete(db, question, "cold", 64)
    assert cold.finish_reason == "stop" and len(cold.token_ids) < 64  # the answer ends at EOS, not the cap
    assert typed_then_submitted(real, db, question, 3, 64) == cold.token_ids
    assert real.complete(db, question, "prefix", 64).token_ids == cold.token_ids


def test_a_typist_with_typos_gets_the_cold_tokens(real):
    question = "Show the name and the release year of the song by the youngest singer."
    trace = Typist(wpm=400, typo_rate=0.15, pause_s=0.2, seed=3).trace(question)
    assert any(e.text != question[:len(e.text)] for e in trace.events)  # it did make typos
    session = replay_in_mode(real, "concert_singer", trace, "session", max_new_tokens=96, speed=4.0)
    cold = real.complete("concert_singer", question, "cold", 96)
    assert session.token_ids == cold.token_ids


def _rows(db: str, sql: str) -> list[tuple]:
    path = default_spider_dir() / "database" / db / f"{db}.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return sorted(conn.execute(sql).fetchall(), key=repr)


@pytest.mark.parametrize("db, question, gold", [
    ("concert_singer", "How many singers do we have?", "SELECT count(*) FROM singer"),
    ("concert_singer", "What are the names of the stadiums that had a concert in 2014?",
     "SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id WHERE T1.year = 2014"),
])
def test_a_plain_question_gets_sql_that_matches_the_gold_result(real, db, question, gold):
    result = real.complete(db, question, "prefix", 128)
    sql = extract_sql(result.text)
    assert _rows(db, sql) == _rows(db, gold), f"{question!r} -> {sql!r}"


def test_every_kernel_level_gives_the_same_bits(real):
    """The AVX2 kernels (and AVX-512 without VNNI) on the very packed weights: the same logits,
    bit for bit, as the level the engine picked (every layer runs in the kernel library)."""
    ops = real.runner.ops
    ids = real.prompt_for("concert_singer").prompt_ids("How many concerts are there?")
    best = real.worker.run_sync(lambda: real.runner.prefill(ids).last_logits)
    for level in cpu_isa.supported():
        kernel = qk.load(level)
        saved = ops.kernel
        try:
            ops.kernel = kernel
            logits = real.worker.run_sync(lambda: real.runner.prefill(ids).last_logits)
        finally:
            ops.kernel = saved
        assert torch.equal(logits, best), level.name


def test_prompt_lookup_drafts_keep_the_greedy_tokens_in_fewer_forwards(real):
    question = "What are the names and countries of singers older than 30?"
    saved = real.draft_tokens
    try:
        real.draft_tokens = 0
        plain = real.complete("concert_singer", question, "prefix", 96)
        real.draft_tokens = 4
        drafted = real.complete("concert_singer", question, "prefix", 96)
    finally:
        real.draft_tokens = saved
    assert drafted.token_ids == plain.token_ids
    assert plain.extra["decode_forwards"] == len(plain.token_ids) - 1 + (plain.finish_reason == "stop")
    assert drafted.extra["decode_forwards"] < plain.extra["decode_forwards"]  # SQL copies the schema's names


def test_table_blocks_serve_the_trained_model(tmp_path):
    """The table cache on the model as served (its own module tree, quantized kernels): blocks
    precompute, place at any position (their keys rotated by the tree's rotary function) and
    answer, the SQL right; in the schema's own order pfk keeps the cold answer's first tokens."""
    from headstart.build import build_runtime

    runtime = build_runtime(model=SMALL_MODEL, table_cache="pfk", p0_cache_on_disk=False, threads=2,
                            chunk_tokens=64)
    try:
        db, question = "concert_singer", "How many singers do we have?"
        runtime.prefix_source.precompute(db)
        cold = runtime.complete(db, question, "cold", 48)
        tables = runtime.complete(db, question, max_new_tokens=48, tables=("singer",))
        layout = runtime.prefix_source.layout(db)
        assert tables.cached_tokens_at_submit >= len(layout.head_ids) + len(layout.texts["singer"].ids)
        assert tables.computed_tokens_at_submit == tables.prompt_tokens - tables.cached_tokens_at_submit
        assert tables.finish_reason == "stop" and "count" in extract_sql(tables.text).lower()
        assert tables.token_ids[:3] == cold.token_ids[:3]
    finally:
        runtime.shutdown()


def test_shift_retention_rotates_keys_on_the_trained_model(real):
    """A data session's `shift` drops a span and re-rotates the keys after it, with the served
    tree's rotary function: layer 0's kept keys land where a fresh prefill puts them."""
    from headstart.data.retention import shift_out

    prompt = real.prompt_for("concert_singer")
    a, b, c = prompt.base_ids[:40], prompt.base_ids[40:60], prompt.base_ids[60:100]
    shifted = shift_out(real.model, real.runner.prefill(a + b + c), len(a), len(b))
    fresh = real.runner.prefill(a + c)
    assert shifted.ids == fresh.ids
    got, want = shifted.cache.layers[0], fresh.cache.layers[0]
    assert torch.allclose(got.keys, want.keys, atol=1e-4, rtol=0)  # float32: the rotation's rounding (keys reach ~150)
    assert torch.equal(got.values, want.values)
