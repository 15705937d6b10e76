"""The rows log (headstart/data/live_rows.py) against a real Redis: a push numbered and logged in
one step, push ids answering a retry with the earlier push, renumbering above a floor, a full
store (a real Redis at a tiny maxmemory, `noeviction`) refusing a push whole, and an
acknowledged push surviving a crash of a Redis whose fsync is slowed (strace's fault injection)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from headstart.data.live_store import LiveStore, StoreFull
from headstart.engine.errors import InvalidInput
from headstart.redis_server import local_redis
from tests.redis_fixture import slow_fsync_binary


@pytest.fixture
def store(redis_url):
    s = LiveStore(redis_url, prefix=f"t{uuid.uuid4().hex[:12]}", max_rows=5, socket_timeout_s=5.0)
    yield s
    s.close()


def row(i: int) -> dict:
    return {"table": "orders", "values": {"id": i, "amount": i * 1.5}}


def test_a_push_is_numbered_and_logged_in_one_step(store):
    assert store.log_push("s1", [row(1), row(2), row(3)]).seqs == [1, 2, 3]
    assert store.log_push("s1", [row(4), row(5)]).seqs == [4, 5]
    assert store.log_push("s2", [row(1)]).seqs == [1]
    assert store.rows("s1") == [(s, row(s)) for s in range(1, 6)] and store.last_seq("s1") == 5
    store.log_push("s1", [row(6), row(7), row(8)])
    assert [s for s, _ in store.rows("s1")] == [4, 5, 6, 7, 8]  # the newest max_rows=5
    # the member is the canonical [seq,row] JSON the log always kept (a rebuild parses it)
    assert store.client.zrange(store.key("s2", "rows"), 0, -1) == [b'[1,{"table":"orders","values":'
                                                                     b'{"amount":1.5,"id":1}}]']
    with pytest.raises(ValueError):
        store.log_push("s1", [])


def test_a_retried_push_id_gets_the_earlier_push_and_adds_nothing(store):
    first = store.log_push("s", [row(1), row(2)], "p-1")
    assert (first.seqs, first.replayed, first.ack) == ([1, 2], False, None)
    again = store.log_push("s", [row(1), row(2)], "p-1")
    assert (again.seqs, again.replayed, again.ack) == ([1, 2], True, None)  # not acked yet: its seqs
    ack = {"seqs": [1, 2], "dropped": 0, "dropped_seqs": [], "dropped_total": 0, "buffered": 2}
    assert store.record_ack("s", "p-1", ack)
    assert store.log_push("s", [row(1), row(2)], "p-1") == ([1, 2], True, ack)
    assert store.last_seq("s") == 2 and len(store.rows("s")) == 2  # nothing added by the retries
    with pytest.raises(InvalidInput, match="other rows"):
        store.log_push("s", [row(9)], "p-1")
    assert store.log_push("s", [row(3)], "p-2").seqs == [3]  # another id: another push
    assert store.log_push("s", [row(4)]).seqs == [4]  # no id: always a new push
    # a push that failed as a whole leaves the log with its id: its retry is a new push
    store.unlog_push("s", [3], "p-2")
    assert [s for s, _ in store.rows("s")] == [1, 2, 4] and not store.record_ack("s", "p-2", ack)
    assert store.log_push("s", [row(3)], "p-2") == ([5], False, None)


def test_push_ids_leave_after_their_ttl_or_past_the_bound(store):
    store.max_push_ids = 2
    for i in range(1, 4):
        store.log_push("s", [row(i)], f"p-{i}")
    assert store.client.hlen(store.key("s", "pushes")) == 2
    assert store.log_push("s", [row(1)], "p-1").seqs == [4]  # the oldest id left: a new push
    store.push_id_ttl_s = 0.001
    time.sleep(0.05)  # the ids logged so far are older than the ttl now
    store.log_push("s", [row(5)], "p-5")
    assert store.client.hkeys(store.key("s", "pushes")) == [b"p-5"]
    assert store.client.zrange(store.key("s", "push_ids"), 0, -1) == [b"p-5"]


def test_a_push_renumbered_above_a_floor_replaces_its_rows(store):
    logged = store.log_push("s", [row(1), row(2)], "p")
    again = store.log_push("s", [row(1), row(2)], "p", floor=70, replacing=(logged.seqs[0], logged.seqs[-1]))
    assert again.seqs == [71, 72] and store.last_seq("s") == 72
    assert store.rows("s") == [(71, row(1)), (72, row(2))]  # the old seqs are gone
    assert store.log_push("s", [row(1), row(2)], "p").seqs == [71, 72]  # the id names the new seqs
    assert store.log_push("s", [row(3)], floor=10).seqs == [73]  # a floor below the counter changes nothing


@pytest.mark.parametrize("push_id", [7, "x" * 129, "tab\there"])
def test_bad_push_ids_are_refused(push_id):
    from headstart.data.live_rows import check_push_id

    with pytest.raises(InvalidInput, match="push_id"):
        check_push_id(push_id)
    assert check_push_id(None) is None and check_push_id("") is None and check_push_id("a:1") == "a:1"


def test_a_full_store_refuses_a_push_whole_and_keeps_what_it_acknowledged(tmp_path):
    """A real Redis at a tiny maxmemory that evicts nothing (the chart's policy): pushes go in until
    one is refused as StoreFull; it wrote nothing (no seq handed out, no row), every acknowledged
    row is still there, and reads go on."""
    with local_redis(dir=tmp_path, extra_args=["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]) as server:
        store = LiveStore(server.url, max_rows=1_000_000)
        try:
            acked, big = [], "x" * 4000
            with pytest.raises(StoreFull) as refused:
                for i in range(10_000):
                    acked += store.log_push("s", [{"table": "t", "values": {"id": i, "v": big}}] * 4).seqs
            assert refused.value.code == "STORE_FULL" and acked
            assert store.last_seq("s") == acked[-1]  # the refused push took no seq
            assert [seq for seq, _ in store.rows("s")] == acked
            with pytest.raises(StoreFull):
                store.put_meta("other", {"db": "x"})  # every write is refused alike
        finally:
            store.close()


def test_an_acknowledged_push_survives_a_crash_while_fsync_is_slow(tmp_path):
    """Issue 45: with `appendfsync everysec` and a slow fsync (1.5 s, injected), Redis 7.0 postpones
    writing its file yet replies: a crash then lost acknowledged rows. The embedded Redis writes
    and syncs before each reply (`always`): a SIGKILL right after any ack loses nothing."""
    binary = slow_fsync_binary()
    with local_redis(dir=tmp_path, binary=binary, aof=True) as server:
        acked = []
        for i in range(3):
            store = LiveStore(server.url)
            try:
                for j in range(3):  # back to back: the first's fsync is still running for the others
                    acked += store.log_push("s", [row(3 * i + j)], f"p-{i}-{j}").seqs
            finally:
                store.close()
            server.kill()  # a crash right after the acks
            server.start()
            store = LiveStore(server.url)
            try:
                assert [seq for seq, _ in store.rows("s")] == acked and store.last_seq("s") == acked[-1]
            finally:
                store.close()


def test_the_slow_fsync_wrapper_runs_the_server_itself_under_a_tracer(tmp_path):
    """The wrapper's process is the server (so kill() is a crash of it), traced by strace (which
    injects the delay into its fsyncs): what makes the test above mean something."""
    import redis

    binary = slow_fsync_binary()
    assert Path(binary).name == "redis_server_slow_fsync.sh"
    with local_redis(dir=tmp_path, binary=binary, aof=True) as server:
        with redis.Redis.from_url(server.url) as client:
            assert int(client.info("server")["process_id"]) == server.process.pid
        status = Path(f"/proc/{server.process.pid}/status").read_text()
        tracer = int(next(line.split()[1] for line in status.splitlines() if line.startswith("TracerPid:")))
        assert tracer != 0 and "strace" in Path(f"/proc/{tracer}/comm").read_text()
