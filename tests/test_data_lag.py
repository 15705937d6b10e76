"""Bounded ingestion lag (issue 45): a data session's lag (acknowledged pushes behind, their
rows, the oldest one's age), pushes coalesced under backlog with the same cache as one push at a
time (random:tiny in float32 and float64), and the backpressure bound (IngestionBehind)."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from headstart.data import DataSession, DataSettings
from headstart.data.lag import IngestionBehind, IngestionLag, Lag, LagBound, LagHistogram, LagSummary
from headstart.engine.runtime import EngineRuntime
from tests.test_data_sessions import QUESTION, cold_answer, rows
from tests.worker_gates import hold_worker

PUSHES, ROWS_PER_PUSH = 6, 2


@pytest.fixture(scope="module", params=["float32", "float64"])
def runtime(request):
    rt = EngineRuntime.from_settings(model="random:tiny", dtype=request.param, p0_cache_on_disk=False,
                                     chunk_tokens=256, debounce_ms=0.0, threads=1,
                                     data_max_lag_versions=4, data_max_lag_s=0.0)
    yield rt
    rt.shutdown()


def _db(path) -> str:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE readings (id INTEGER PRIMARY KEY, sensor TEXT NOT NULL, value REAL, ts TEXT)")
    conn.execute("INSERT INTO readings VALUES (1, 'seed', 0.5, 't0')")
    conn.commit()
    conn.close()
    return str(path)


def _session(runtime, path, histogram=None) -> DataSession:
    return DataSession(runtime, _db(path), DataSettings(max_row_tokens=40, batch_rows=32),
                       lag_histogram=histogram)


def _layers(kv) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(kv.cache.keys(i), kv.cache.values(i)) for i in range(kv.cache.num_layers)]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_lag_counts_pushes_rows_and_the_oldest_age():
    clock = Clock()
    lag = IngestionLag(clock)
    assert lag.current() == Lag()
    lag.pushed(3, 3)
    clock.now += 2
    lag.pushed(5, 2)
    clock.now += 1
    assert lag.current() == Lag(2, 5, 3.0)
    assert lag.handled(4) == [3.0]  # the first push is complete, the second not (seq 5 is waiting)
    assert lag.current() == Lag(1, 2, 1.0)
    assert lag.handled(5) == [1.0] and lag.current() == Lag()


@pytest.mark.parametrize("bound, lag, exceeded", [
    (LagBound(), Lag(1000, 5000, 999.0), None),
    (LagBound(max_versions=4), Lag(3, 9, 50.0), None),
    (LagBound(max_versions=4), Lag(4, 9, 0.1), "4 pushes behind"),
    (LagBound(max_seconds=10.0), Lag(2, 2, 9.9), None),
    (LagBound(max_seconds=10.0), Lag(2, 2, 10.0), "10.0 s behind"),
])
def test_the_bound_names_what_it_is_past(bound, lag, exceeded):
    reason = bound.exceeded(lag)
    assert (reason is None) if exceeded is None else exceeded in reason


def test_the_retry_hint_follows_the_rate_rows_were_handled_at():
    clock = Clock()
    lag = IngestionLag(clock)
    assert lag.retry_after(LagBound(max_versions=2)) == 1.0  # nothing handled yet: a second
    for seq in range(1, 11):
        lag.pushed(seq, 1)
    lag.handled(0)
    clock.now += 1.0
    lag.handled(2)  # 2 rows in a second
    clock.now += 1.0
    lag.handled(4)
    # 6 rows left, half of them at 2 rows/s
    assert lag.retry_after(LagBound(max_versions=2)) == pytest.approx(1.5)
    assert lag.retry_after(LagBound(max_versions=2, max_seconds=1.0)) == pytest.approx(1.5)  # 2 s - 0.5 s


def test_histogram_is_cumulative_and_summary_bounded():
    h = LagHistogram((0.1, 1.0))
    for s in (0.05, 0.5, 0.5, 3.0):
        h.observe(s)
    assert h.snapshot() == ([1, 3], pytest.approx(4.05), 4)
    assert LagSummary.of([Lag(), Lag(3, 6, 2.0), Lag(1, 1, 5.0)]) == LagSummary(3, 4, 5.0, 2)
    assert LagSummary.of([]) == LagSummary()


def test_coalesced_pushes_give_the_cache_of_one_push_at_a_time(runtime, tmp_path):
    one = _session(runtime, tmp_path / "one.sqlite")
    histogram = LagHistogram()
    many = _session(runtime, tmp_path / "many.sqlite", histogram)
    try:
        for i in range(PUSHES):
            one.push(rows(ROWS_PER_PUSH * i, ROWS_PER_PUSH))
            one.wait_idle()
            assert one.lag() == Lag()
        many.lag_bound = LagBound()  # this test is about the backlog, not its bound
        gate = hold_worker(runtime.worker)  # a backlog: ingestion cannot run
        try:
            for i in range(PUSHES):
                many.push(rows(ROWS_PER_PUSH * i, ROWS_PER_PUSH))
            lag = many.lag()
            assert (lag.versions, lag.rows) == (PUSHES, PUSHES * ROWS_PER_PUSH) and lag.seconds > 0
            described = many.describe()
            assert (described["lag_versions"], described["lag_rows"]) == (PUSHES, PUSHES * ROWS_PER_PUSH)
        finally:
            gate.set()
        many.wait_idle()
        # the backlog went in as one forward and one version, not one per push
        assert one.describe()["batches"] == PUSHES and many.describe()["batches"] == 1
        assert many.lag() == Lag() and many.describe()["lag_seconds"] == 0
        assert histogram.snapshot()[2] == PUSHES  # every push's delay counted once
        assert many.data_version == one.data_version == PUSHES * ROWS_PER_PUSH
        assert many.context_ids() == one.context_ids()
        for (k1, v1), (k2, v2) in zip(_layers(one._live), _layers(many._live)):
            tol = dict(rtol=1e-5, atol=1e-5) if k1.dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(k2, k1, **tol)
            torch.testing.assert_close(v2, v1, **tol)
        got = many.query(QUESTION, 8).token_ids
        assert got == one.query(QUESTION, 8).token_ids
        assert got == cold_answer(runtime, many.context_ids() + many.prompt.question_ids(QUESTION), 8)[0]
    finally:
        one.close()
        many.close()


def test_past_the_bound_a_push_is_refused_whole_with_a_retry_hint(runtime, tmp_path):
    session = _session(runtime, tmp_path / "bound.sqlite")
    try:
        assert session.lag_bound == LagBound(max_versions=4)  # the engine setting
        gate = hold_worker(runtime.worker)
        try:
            acks = [session.push(rows(i, 1)) for i in range(4)]
            with pytest.raises(IngestionBehind, match="4 pushes behind") as refused:
                session.push(rows(4, 1))
            assert refused.value.code == "INGESTION_BEHIND" and 0.1 <= refused.value.retry_after_s <= 30
            d = session.describe()
            assert (d["accepted"], d["buffered"], d["behind_refusals"], d["dropped"]) == (4, 4, 1, 0)
        finally:
            gate.set()
        session.wait_idle()
        # every acknowledged row is in; the refused one is not, and the session takes the next push
        assert [a.seqs for a in acks] == [(1,), (2,), (3,), (4,)] and session.data_version == 4
        assert session.execute("SELECT count(*) FROM readings WHERE id >= 100", 4)[1] == [(4,)]
        assert session.push(rows(4, 1)).seqs == (5,)
        session.wait_idle()
        assert session.data_version == 5 and session.lag() == Lag()
    finally:
        session.close()
