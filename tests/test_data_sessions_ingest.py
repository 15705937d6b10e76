"""Data sessions' rows from a caller (issue 12, part D): the caller's sequence
numbers, data version = the newest ingested seq, on_version once per batch,
and a session rebuilt from its rows reaching the same cache and version
(random:tiny, float64)."""

from __future__ import annotations

import pytest

from headstart.data import DataSession, DataSettings
from headstart.data.types import VersionEvent
from headstart.engine.errors import InvalidInput
from tests.test_data_sessions import QUESTION, cold_answer, db, open_session, rows, runtime  # noqa: F401 (fixtures)
from tests.worker_gates import hold_worker


def test_caller_seqs_number_the_rows_and_the_version(runtime, db):
    session = open_session(runtime, db, batch_rows=2)
    try:
        ack = session.push(rows(0, 2), seqs=[10, 20])
        assert ack.seqs == (10, 20)
        bad = [([20, 21], "seqs\\[0\\]: 20 is not greater than 20"),
               ([25, 25], "seqs\\[1\\]: 25 is not greater than 25"),
               ([30], "list of 2"), ([30, "31"], "not an integer"), ([True, 40], "not an integer")]
        for seqs, message in bad:
            with pytest.raises(InvalidInput, match=message):
                session.push(rows(2, 2), seqs=seqs)
        assert session.describe()["accepted"] == 2  # a refused push keeps nothing
        assert session.push(rows(2, 1), seqs=[30]).seqs == (30,)
        assert session.push(rows(3, 2)).seqs == (31, 32)  # the session numbers on from the last seq
        session.wait_idle()
        assert session.data_version == 32
        sql = "SELECT count(*) FROM readings WHERE id >= 100"
        got = [session.execute(sql, v)[1][0][0] for v in (9, 10, 29, 30, 32)]
        assert got == [0, 1, 2, 3, 5]  # exactly the rows with seq <= version
    finally:
        session.close()


def test_on_version_is_called_once_per_batch_with_its_version(runtime, db):
    events: list[VersionEvent] = []
    session = DataSession(runtime, db, DataSettings(max_row_tokens=40, batch_rows=2, buffer_rows=5),
                          on_version=events.append)
    try:
        gate = hold_worker(runtime.worker)
        try:
            session.push(rows(0, 3), seqs=[1, 2, 3])
            session.push(rows(3, 4), seqs=[5, 6, 7, 9])  # the buffer keeps 5: seqs 1 and 2 go
        finally:
            gate.set()
        session.wait_idle()
        # seqs 1..3 (the first push) were dropped: the second push is behind until version 9
        assert events == [VersionEvent(5, 2, 2, 2, 1), VersionEvent(7, 2, 2, 4, 1), VersionEvent(9, 1, 2, 5, 0)]
        assert events[-1].lag_seconds == 0.0 and events[0].lag_seconds > 0
        assert session.data_version == 9
    finally:
        session.close()


def test_a_failing_listener_does_not_stop_ingestion(runtime, db):
    calls = []

    def listener(event):
        calls.append(event.version)
        raise RuntimeError("listener down")

    session = DataSession(runtime, db, DataSettings(max_row_tokens=40), on_version=listener)
    try:
        session.push(rows(0, 2))
        session.wait_idle()
        session.push(rows(2, 1))
        session.wait_idle()
        assert calls == [2, 3] and session.describe()["rows_in_cache"] == 3
    finally:
        session.close()


@pytest.mark.parametrize("retention", ["rebuild", "shift"])
def test_a_session_rebuilt_from_its_rows_has_the_same_cache_and_version(runtime, db, retention):
    settings = dict(retention_tokens=90, retention=retention, batch_rows=3)
    original = open_session(runtime, db, **settings)
    log: list[tuple[int, dict]] = []
    try:
        for i in range(5):
            batch = rows(3 * i, 3)
            if i == 2:
                batch[1] = {"table": "readings", "values": {"id": 1, "sensor": "dup"}}  # the database refuses it
            seqs = [100 * i + 7 * j + 1 for j in range(3)]
            original.push(batch, seqs=seqs)
            log.extend(zip(seqs, batch))
            original.wait_idle()
        want = original.describe()
        assert want["retired"] > 0 and want["refused"] == 1  # retention cut the oldest rows
        rebuilt = DataSession(runtime, db, DataSettings(max_row_tokens=40, **settings), rows=iter(log))
        try:
            got = rebuilt.describe()
            assert rebuilt.context_ids() == original.context_ids()
            assert rebuilt.data_version == original.data_version == 415
            assert (got["rows_in_cache"], got["sliding_tokens"], got["refused"], got["state"]) == (
                want["rows_in_cache"], want["sliding_tokens"], 1, "live")
            sql = "SELECT id FROM readings ORDER BY id"
            for version in (0, 101, 215, 415):  # the working copy holds every row, retired ones too
                assert rebuilt.execute(sql, version) == original.execute(sql, version)
            if retention == "rebuild":  # both exact: the same answer as a cold prefill
                result = rebuilt.query(QUESTION, 8)
                assert result.token_ids == original.query(QUESTION, 8).token_ids
                assert result.token_ids == cold_answer(
                    runtime, rebuilt.context_ids() + rebuilt.prompt.question_ids(QUESTION), 8)[0]
            with pytest.raises(InvalidInput, match="not greater than 415"):
                rebuilt.push(rows(20, 1), seqs=[415])
            rebuilt.push(rows(20, 1))
            rebuilt.wait_idle()
            assert rebuilt.data_version == 416
        finally:
            rebuilt.close()
    finally:
        original.close()


def test_a_rebuild_refuses_the_rows_it_cannot_take_and_goes_on(runtime, db):
    """A logged row the session cannot take (an int beyond 64 bits, logged before that was refused
    at the edge; a wrong type) is refused by name as a push is; once it broke every call for good."""
    log = [(3, rows(0, 1)[0]), (5, {"table": "readings", "values": {"id": 1 << 63, "sensor": "big"}}),
           (8, {"table": "readings", "values": {"sensor": 1}}), (9, rows(1, 1)[0])]
    session = DataSession(runtime, db, DataSettings(max_row_tokens=40), rows=log)
    try:
        got = session.describe()
        assert (got["state"], got["refused"], got["rows_in_cache"], session.data_version) == ("live", 2, 2, 9)
        assert [seq for seq, _ in got["last_refusals"]] == [5, 8]
        assert "outside SQLite's integer range" in got["last_refusals"][0][1]
        assert "readings.sensor is TEXT" in got["last_refusals"][1][1]
        assert session.execute("SELECT count(*) FROM readings WHERE id >= 100", 9)[1] == [(2,)]
        session.push(rows(2, 1))  # and it goes on after the last seq of the log
        session.wait_idle()
        assert session.data_version == 10
    finally:
        session.close()


def test_an_ingestion_failure_fails_the_session_and_says_so(runtime, db):
    """Any failure of an ingestion batch (here the working copy's file is corrupted under it, as a
    failing disk would) moves the session to FAILED: on_failure is told once, describe names the
    reason, and every call but describe and close is SESSION_FAILED. It used to stop silently."""
    from headstart.engine.errors import SessionFailed

    failures = []
    session = DataSession(runtime, db, DataSettings(max_row_tokens=40), on_failure=failures.append)
    try:
        session.push(rows(0, 2))
        session.wait_idle()
        with open(session.copy.path, "r+b") as f:  # the header's magic string: "file is not a database"
            f.write(b"\0" * 100)
        session.push(rows(2, 2))
        session.wait_idle()
        got = session.describe()
        assert got["state"] == "failed" and "not a database" in got["failure"], got
        assert len(failures) == 1 and failures[0] == got["failure"]
        assert session.data_version == 2  # the failed batch never reached the cache
        for call in (lambda: session.push(rows(4, 1)), lambda: session.query(QUESTION, 4),
                     lambda: session.evaluate([QUESTION], 4), lambda: session.execute("SELECT 1", 2)):
            with pytest.raises(SessionFailed, match="not a database"):
                call()
    finally:
        session.close()
    assert session.describe()["state"] == "closed"


def test_rebuild_rows_are_validated(runtime, db):
    with pytest.raises(InvalidInput, match="not greater than 3"):
        DataSession(runtime, db, rows=[(3, rows(0, 1)[0]), (3, rows(1, 1)[0])])
    with pytest.raises(InvalidInput, match="pair"):
        DataSession(runtime, db, rows=[rows(0, 1)[0]])


def test_retention_cut_keeps_half_a_region_and_ignores_batching():
    """Past the bound the oldest rows leave until `keep` tokens remain, so a
    rebuild comes once per (bound - keep) tokens of new rows, not per batch;
    the cut is the same however the rows were batched (a rebuilt session keeps
    what the live one kept), and replaying from an earlier cut agrees."""
    import random

    from headstart.data.ingest import retention_cut

    assert retention_cut([], 100, 50) == 0
    assert retention_cut([30, 30, 30], 100, 50) == 0  # under the bound: nothing leaves
    assert retention_cut([30, 30, 30, 30], 100, 50) == 3  # 120 > 100: down to 30 <= 50
    assert retention_cut([10, 10, 95], 100, 50) == 2  # the newest row stays even when larger than keep
    with pytest.raises(InvalidInput, match="retention_keep"):
        DataSettings(retention_keep=0)
    assert DataSettings(retention_tokens=2048).retention_window == (2048, 1024)
    rng = random.Random(7)
    counts = [rng.randint(5, 40) for _ in range(400)]
    whole = retention_cut(counts, 300, 150)
    assert sum(counts[whole:]) <= 300
    # live: batches of any size, each retention replayed from the region's first row
    for trial in range(20):
        start, end = 0, 0
        while end < len(counts):
            end = min(len(counts), end + rng.randint(1, 12))
            start += retention_cut(counts[start:end], 300, 150)
        assert start == whole
    # rebuilds: the minimal cut would have left after every batch past the bound
    rebuilds, start = 0, 0
    for end in range(1, len(counts) + 1):
        cut = retention_cut(counts[start:end], 300, 150)
        rebuilds, start = rebuilds + bool(cut), start + cut
    assert rebuilds <= sum(counts) / 150 + 1
