"""Data sessions (issue 12, engine core): validation, the bounded buffer's
drop-oldest counting, data versions, retention (shift's drift, rebuild
exact), query exactness and a query during a rebuild (random:tiny, float64)."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
import torch

from headstart.data import DataSession, DataSettings
from headstart.data.retention import shift_out
from headstart.data.workcopy import SqlError
from headstart.engine.errors import InvalidInput
from headstart.engine.runtime import EngineRuntime
from tests.worker_gates import hold_worker

QUESTION = "What is the average value per sensor?"


@pytest.fixture(scope="module")
def runtime():
    rt = EngineRuntime.from_settings(model="random:tiny", dtype="float64", p0_cache_on_disk=False,
                                     chunk_tokens=48, debounce_ms=0.0, threads=1)
    yield rt
    rt.shutdown()


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "readings.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE readings (id INTEGER PRIMARY KEY, sensor TEXT NOT NULL, value REAL, ts TEXT)")
    conn.execute("INSERT INTO readings VALUES (1, 'seed', 0.5, 't0')")
    conn.commit()
    conn.close()
    return str(path)


def rows(start: int, n: int) -> list[dict]:
    return [{"table": "readings", "values": {"id": 100 + i, "sensor": f"s{i % 3}", "value": 1.25 * i, "ts": f"t{i}"}}
            for i in range(start, start + n)]


def cold_answer(runtime, ids: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of a cold prefill of `ids`, and the first token's logits."""
    kv = runtime.runner.prefill(ids)
    first, tokens = kv.last_logits.clone(), []
    for _ in range(max_new_tokens):
        token = int(torch.argmax(kv.last_logits))
        if token in runtime.stop_ids:
            break
        tokens.append(token)
        runtime.runner.extend(kv, [token])
    return tokens, first


def open_session(runtime, db, **settings) -> DataSession:
    settings.setdefault("max_row_tokens", 40)
    return DataSession(runtime, db, DataSettings(**settings))


def test_malformed_rows_are_rejected_with_the_problem_named(runtime, db):
    session = open_session(runtime, db)
    try:
        bad = [
            ([{"table": "nope", "values": {"id": 1}}], "no table 'nope'"),
            ([{"table": "readings", "values": {"colour": "red"}}], "no column 'colour'"),
            ([{"table": "readings", "values": {"id": "x", "sensor": "a"}}], "not an integer"),
            ([{"table": "readings", "values": {"sensor": "a", "value": "high"}}], "not a number"),
            ([{"table": "readings", "values": {"sensor": 7}}], "not text"),
            ([{"table": "readings", "values": {"sensor": "a", "id": True}}], "bool values"),
            ([{"table": "readings", "values": {"value": 1.0}}], "NOT NULL"),
            ([{"table": "readings", "values": {"sensor": "a" * 600}}], "readings.sensor: text of 600 characters"),
            # SQLite's INTEGER is 64 bits (issue 29: 2^63 once froze ingestion), in any column
            ([{"table": "readings", "values": {"id": 1 << 63, "sensor": "a"}}], "readings.id: 9223372036854775808 is "
                                                                               "outside SQLite's integer range"),
            ([{"table": "readings", "values": {"id": -(1 << 63) - 1, "sensor": "a"}}], "outside SQLite's integer"),
            ([{"table": "readings", "values": {"sensor": "a", "value": 1 << 64}}], "readings.value: .* outside"),
            ([{"table": "readings", "values": {"sensor": "x y " * 60}}], "tokens; the limit is 40"),
            (rows(0, 2) + ["not a row"], "row 2"),
            ([], "non-empty list"),
        ]
        for push, message in bad:
            with pytest.raises(InvalidInput, match=message):
                session.push(push)
        assert session.describe()["accepted"] == 0  # a bad push keeps nothing, not even its good rows
        extremes = [{"table": "readings", "values": {"id": v, "sensor": "edge"}} for v in ((1 << 63) - 1, -(1 << 63))]
        ack = session.push(rows(0, 2) + extremes)  # the session is still usable; the range's ends are in it
        assert ack.seqs == (1, 2, 3, 4) and ack.dropped == 0
        session.wait_idle()
        assert session.describe()["rows_in_cache"] == 4 and session.describe()["state"] == "live"
        assert session.execute("SELECT max(id), min(id) FROM readings", 4)[1] == [((1 << 63) - 1, -(1 << 63))]
    finally:
        session.close()


def test_types_follow_sqlite_affinity():
    from headstart.data.rows import validate_row
    from headstart.schema.model import Column, Schema, Table

    schema = Schema("s", (Table("t", (Column("n", "INT"), Column("d", "DECIMAL(10,2)"), Column("at", "DATETIME"),
                                      Column("note", "VARCHAR(20)"), Column("any", ""))),))
    row = validate_row(schema, "T", {"N": 3, "d": 2.5, "at": "2026-11-24 07:00", "note": "it's", "any": 1.0}, 200)
    assert row.line == "t(3, 2.5, '2026-11-24 07:00', 'it''s', 1.0)" and row.table == "t"
    with pytest.raises(InvalidInput, match="DECIMAL"):
        validate_row(schema, "t", {"d": "2.5"}, 200)
    with pytest.raises(InvalidInput, match="not a finite number"):
        validate_row(schema, "t", {"d": float("nan")}, 200)


def test_full_buffer_drops_the_oldest_unprocessed_rows_counted(runtime, db):
    session = open_session(runtime, db, buffer_rows=4, batch_rows=2)
    try:
        gate = hold_worker(runtime.worker)  # ingestion cannot run: the rows stay buffered
        try:
            first = session.push(rows(0, 3))
            second = session.push(rows(3, 4))
        finally:
            gate.set()
        assert first.seqs == (1, 2, 3) and first.dropped == 0
        assert second.seqs == (4, 5, 6, 7) and second.dropped_seqs == (1, 2, 3) and second.dropped_total == 3
        session.wait_idle()
        info = session.describe()
        assert (info["accepted"], info["dropped"], info["processed"]) == (7, 3, 4)
        # exactly the kept rows reached the working copy, in 2 batches of 2; the version is the newest seq
        assert info["data_version"] == 7 and info["batches"] == 2
        _, got = session.execute("SELECT id FROM readings WHERE id >= 100 ORDER BY id", 7)
        assert [r[0] for r in got] == [103, 104, 105, 106]
    finally:
        session.close()


def test_each_batch_bumps_the_version_and_sql_runs_on_that_version(runtime, db):
    session = open_session(runtime, db, batch_rows=2)
    try:
        gate = hold_worker(runtime.worker)
        try:
            session.push(rows(0, 5))
        finally:
            gate.set()
        session.wait_idle()
        assert session.data_version == 5 and session.describe()["batches"] == 3  # 2 + 2 + 1 rows, seqs 1..5
        counts = [session.execute("SELECT count(*) FROM readings", v)[1][0][0] for v in (0, 2, 4, 5)]
        assert counts == [1, 3, 5, 6]  # the catalogue's seed row, then each batch
        assert session.execute("SELECT count(*) FROM readings", 3)[1][0][0] == 4  # rows with seq <= 3
        with pytest.raises(InvalidInput, match="not in 0..5"):
            session.execute("SELECT 1", 6)
        with pytest.raises(SqlError):
            session.execute("DELETE FROM readings", 5)
        assert session.execute("SELECT count(*) FROM readings", 5)[1][0][0] == 6  # nothing was written
    finally:
        session.close()


def test_query_is_exact_and_reports_its_version(runtime, db):
    session = open_session(runtime, db, retention_tokens=4000)
    try:
        for i in range(3):
            session.push(rows(4 * i, 4))
        session.wait_idle()
        result = session.query(QUESTION, max_new_tokens=12)
        context = session.context_ids()
        assert result.data_version == session.data_version and result.rows_in_cache == 12
        assert result.context_tokens == len(context)
        tokens, first = cold_answer(runtime, context + session.prompt.question_ids(QUESTION), 12)
        assert result.token_ids == tokens
        assert torch.allclose(result.first_logits, first, atol=1e-9, rtol=0)
        assert session.describe()["cache_tokens"] == len(context)  # the question left no trace
    finally:
        session.close()


def test_rebuild_retention_is_exact(runtime, db):
    session = open_session(runtime, db, retention_tokens=90, retention="rebuild", batch_rows=3)
    try:
        for i in range(5):
            session.push(rows(3 * i, 3))
            session.wait_idle()
        info = session.describe()
        assert info["rebuilds"] >= 1 and info["retired"] > 0
        assert 0 < info["sliding_tokens"] <= 90 and info["retention_state"] == "steady"
        result = session.query(QUESTION, max_new_tokens=12)
        context = session.context_ids()
        assert result.rows_in_cache == info["rows_in_cache"] < 15
        tokens, first = cold_answer(runtime, context + session.prompt.question_ids(QUESTION), 12)
        assert result.token_ids == tokens
        assert torch.allclose(result.first_logits, first, atol=1e-9, rtol=0)
    finally:
        session.close()


def test_shift_retention_keeps_the_bound_and_its_drift_is_measured(runtime, db):
    session = open_session(runtime, db, retention_tokens=90, retention="shift", batch_rows=3)
    try:
        for i in range(5):
            session.push(rows(3 * i, 3))
            session.wait_idle()
        info = session.describe()
        assert info["shifts"] >= 1 and info["rebuilds"] == 0 and 0 < info["sliding_tokens"] <= 90
        context = session.context_ids()
        assert info["cache_tokens"] == len(context)
        result = session.query(QUESTION, max_new_tokens=4)
        _, first = cold_answer(runtime, context + session.prompt.question_ids(QUESTION), 1)
        drift = float((result.first_logits - first).abs().max())
        # approximate: the kept rows were computed attending to dropped ones
        assert 0.0 < drift < float("inf")
    finally:
        session.close()


def test_shift_moves_keys_exactly_where_a_fresh_prefill_puts_them(runtime):
    """Layer 0's keys depend only on a token and its position: after dropping a
    span and re-rotating, the kept tokens' layer-0 keys equal a fresh prefill's
    (a wrong angle or sign fails this); values of layer 0 are untouched."""
    a, b, c = list(range(100, 120)), list(range(300, 311)), list(range(500, 530))
    shifted = shift_out(runtime.model, runtime.runner.prefill(a + b + c), len(a), len(b))
    fresh = runtime.runner.prefill(a + c)
    assert shifted.ids == fresh.ids
    got, want = shifted.cache.layers[0], fresh.cache.layers[0]
    assert torch.allclose(got.keys, want.keys, atol=1e-12, rtol=0)
    assert torch.allclose(got.values, want.values, atol=1e-12, rtol=0)
    # deeper layers differ: c attended to b (the approximation a rebuild avoids)
    assert not torch.allclose(shifted.cache.layers[-1].values, fresh.cache.layers[-1].values, atol=1e-6)


def test_query_during_a_rebuild_reads_the_current_cache(runtime, db):
    session = open_session(runtime, db, retention_tokens=90, retention="rebuild", batch_rows=20)
    seen: dict = {}
    rebuild_step, swap = session._rebuild_step, session._swap

    def spy_step():
        if "thread" not in seen:  # mid-rebuild: queue a query, which runs before the next chunk
            seen["context"], seen["rows"] = session.context_ids(), len(session._segments)
            thread = threading.Thread(target=lambda: seen.update(result=session.query(QUESTION, 8)))
            thread.start()
            seen["thread"] = thread  # after start: the test thread joins it once it is here
            deadline = time.monotonic() + 10
            while not any(j.name.startswith("data-query") for j in runtime.worker.scheduler._waiting):
                assert time.monotonic() < deadline
                time.sleep(0.001)
        return rebuild_step()

    def spy_swap():
        seen["swapped_after_query"] = "result" in seen
        swap()

    session._rebuild_step, session._swap = spy_step, spy_swap
    try:
        session.push(rows(0, 12))  # well over the bound: rebuilds of several chunks while rows arrive
        seen_deadline = time.monotonic() + 60
        while "thread" not in seen and time.monotonic() < seen_deadline:
            time.sleep(0.01)
        seen["thread"].join(60)
        session.wait_idle()
        assert seen["swapped_after_query"]
        result = seen["result"]
        assert result.rows_in_cache == seen["rows"] and result.context_tokens == len(seen["context"])
        assert len(seen["context"]) - session.frozen_tokens > 90  # it read the cache before the cut
        tokens, _ = cold_answer(runtime, seen["context"] + session.prompt.question_ids(QUESTION), 8)
        assert result.token_ids == tokens  # exact on the cache it read
        info = session.describe()
        assert info["rebuilds"] >= 1 and info["rows_in_cache"] < 12 and info["sliding_tokens"] <= 90
        after = session.query(QUESTION, 8)
        tokens, _ = cold_answer(runtime, session.context_ids() + session.prompt.question_ids(QUESTION), 8)
        assert after.token_ids == tokens and after.data_version == session.data_version >= result.data_version
    finally:
        session.close()


def test_bad_settings_and_questions_are_typed_errors(runtime, db):
    with pytest.raises(InvalidInput, match="retention must be one of"):
        DataSettings(retention="drop")
    with pytest.raises(InvalidInput, match="SQLite"):
        DataSession(runtime, "/nonexistent/x.sqlite")
    session = open_session(runtime, db)
    try:
        with pytest.raises(InvalidInput):
            session.query("   ", 4)
    finally:
        session.close()


def test_rows_the_database_refuses_are_counted_and_never_cached(runtime, db):
    """Valid rows with a duplicate primary key (the catalogue's seed row, and one
    within the push) are refused by the working copy: counted and named in
    describe(), kept out of the cache, and the rest of the batch goes in."""
    session = open_session(runtime, db, retention_tokens=4000)
    try:
        seed_dup = {"table": "readings", "values": {"id": 1, "sensor": "dup", "value": 0.0}}
        push = rows(0, 2) + [seed_dup] + rows(1, 1) + rows(2, 1)  # rows(1, 1) repeats id 101
        ack = session.push(push)
        session.wait_idle()
        info = session.describe()
        assert (info["accepted"], info["refused"], info["processed"]) == (5, 2, 3)
        assert [seq for seq, _ in info["last_refusals"]] == [ack.seqs[2], ack.seqs[3]]
        assert "UNIQUE" in info["last_refusals"][0][1]
        _, got = session.execute("SELECT id FROM readings ORDER BY id", session.data_version)
        assert [r[0] for r in got] == [1, 100, 101, 102]
        result = session.query(QUESTION, 6)
        context = session.context_ids()
        assert result.rows_in_cache == 3 and result.context_tokens == len(context)
        assert result.token_ids == cold_answer(runtime, context + session.prompt.question_ids(QUESTION), 6)[0]
    finally:
        session.close()


def test_ingestion_yields_to_a_query_and_keeps_its_rows(runtime, db):
    """An ingestion forward in flight stops between layers for a new query
    (SUBMIT preempts STREAM); the query reads the cache without the batch,
    and the batch goes in afterwards, whole and exact."""
    session = open_session(runtime, db, retention_tokens=4000)
    seen: dict = {}
    ingest_step = session._ingest_step

    def spy_step():
        row = ingest_step()
        if "thread" in seen or not hasattr(row, "should_abort"):
            return row
        original = row.should_abort

        def should_abort():
            if "thread" not in seen:  # first poll, inside the forward: a query arrives
                thread = threading.Thread(target=lambda: seen.update(result=session.query(QUESTION, 4)))
                thread.start()
                seen["thread"] = thread
                deadline = time.monotonic() + 10
                while not original():  # the worker asks the running step to yield
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
            return original()

        row.should_abort = should_abort
        return row

    session._ingest_step = spy_step
    try:
        session.push(rows(0, 3))
        deadline = time.monotonic() + 60
        while "thread" not in seen and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["thread"].join(60)
        session.wait_idle()
        assert seen["result"].rows_in_cache == 0 and seen["result"].data_version == 0
        info = session.describe()
        assert (info["processed"], info["rows_in_cache"], info["data_version"]) == (3, 3, 3)
        result = session.query(QUESTION, 6)
        context = session.context_ids()
        assert result.token_ids == cold_answer(runtime, context + session.prompt.question_ids(QUESTION), 6)[0]
    finally:
        session.close()


def test_the_frozen_region_starts_from_the_databases_p0(runtime, db):
    """Same system prompt and schema text as the typing prompt: the frozen
    region shares P0 up to the schema's end (only its last tokens differ)."""
    from headstart.prompt import common_prefix_len

    p0 = runtime.prompt_for(db).base_ids
    session = open_session(runtime, db)
    try:
        shared = common_prefix_len(p0, session.prompt.frozen_ids)
        assert shared >= len(p0) - 4 and session.describe()["cache_tokens"] == session.frozen_tokens
    finally:
        session.close()
