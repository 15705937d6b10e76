"""Runs in worker processes (services/gateway/runs.py) and the loop-lag probe."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time

import pytest

from headstart.client.errors import ApiError
from services.gateway.databases import RunLimits, run_read_only
from services.gateway.loop_lag import LoopLagProbe
from services.gateway.runs import RunPool, _warm

HEAVY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
LIMITS = RunLimits(rows=10, cell_bytes=64, total_bytes=4096, value_bytes=1 << 16, timeout_s=5.0)


@pytest.fixture(scope="module")
def pool():
    pool = RunPool(2)
    yield pool
    pool.shutdown()


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x, y)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, "v" * i) for i in range(30)])
    return path


@pytest.mark.parametrize("sql", ["SELECT x, y FROM t ORDER BY x", "SELECT count(*) FROM t", "SELECT y FROM t"])
def test_a_run_in_a_worker_returns_what_it_returns_in_process(pool, db, sql):
    assert asyncio.run(pool.run(db, sql, LIMITS)) == run_read_only(db, sql, LIMITS)


@pytest.mark.parametrize("sql, limits, code", [
    ("DELETE FROM t", LIMITS, "INVALID_ARGUMENT"),
    ("SELECT nope FROM t", LIMITS, "INVALID_ARGUMENT"),
    (HEAVY, RunLimits(10, 64, 4096, 1 << 16, timeout_s=0.2), "CANCELLED"),
])
def test_a_failed_run_keeps_its_code(pool, db, sql, limits, code):
    with pytest.raises(ApiError) as err:
        asyncio.run(pool.run(db, sql, limits))
    assert err.value.code == code


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_workers_run_at_the_idle_cpu_priority(pool):
    pids = set(pool._executor().map(_warm, range(4)))
    assert pids and os.getpid() not in pids
    assert {os.sched_getscheduler(pid) for pid in pids} == {os.SCHED_IDLE}


def test_loop_lag_probe_sees_a_blocked_loop():
    async def scenario():
        probe = LoopLagProbe(0.001).start()
        await asyncio.sleep(0.02)
        probe.reset()
        time.sleep(0.05)  # the loop is held: the probe's sleeper wakes at least this late
        await asyncio.sleep(0.01)
        probe.stop()
        return probe.stats()

    stats = asyncio.run(scenario())
    assert stats["samples"] >= 1 and stats["max_ms"] >= 45.0
    assert LoopLagProbe().stats() == {"samples": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}


def test_the_list_leaves_out_spider_ids_without_their_file_and_keeps_the_other_sources(tmp_path):
    """issue 46: wta_1 is in Spider's tables.json but its file is not shipped; the page listed it.
    SQLite roots and PostgreSQL aliases are listed as before."""
    import sqlite3

    from headstart.schema.catalogue import Catalogue
    from services.gateway.databases import list_catalogue

    sqlite3.connect(tmp_path / "mine.sqlite").execute("CREATE TABLE t (a INTEGER)").connection.close()
    listed = {d.id: d for d in list_catalogue(Catalogue(sqlite_roots=[tmp_path],
                                                        postgres={"warehouse": "postgresql://u@localhost/w"}))}
    assert "wta_1" not in listed
    assert (listed["world_1"].num_tables, listed["world_1"].can_execute) == (3, True)
    assert listed["mine"].can_execute is True and listed["warehouse"].can_execute is False
