"""LiveStore against a real Redis (its rows log: tests/test_live_rows.py): meta, versions, events, flash registry and answers, the consumer group."""

from __future__ import annotations

import threading
import uuid

import pytest

from headstart.data.live_store import (
    VERSIONS_GROUP,
    FlashLimitExceeded,
    LiveStore,
    LiveStoreUnavailable,
    normalize_question,
)
from headstart.engine.errors import InvalidInput
from headstart.redis_server import free_port


@pytest.fixture
def store(redis_url):
    """A store under a fresh prefix (the session's server is shared by many tests)."""
    s = LiveStore(redis_url, prefix=f"t{uuid.uuid4().hex[:12]}", max_rows=5, max_events=10, max_flash=3,
                  socket_timeout_s=5.0)
    yield s
    s.close()


def row(i: int) -> dict:
    return {"table": "orders", "values": {"id": i, "amount": i * 1.5}}


def test_meta_and_delete_session(store):
    assert store.meta("s") is None
    store.put_meta("s", {"db": "shop", "tenant": "t1"})
    store.log_push("s", [row(1)], "push-1")
    store.publish_version("s", "t1", 1, 1, 0)
    store.register_flash("s", "how many orders?")
    assert store.meta("s") == {"db": "shop", "tenant": "t1"}
    store.delete_session("s")
    assert store.meta("s") is None and store.rows("s") == [] and store.current_version("s") == 0
    assert store.last_seq("s") == 0 and not store.client.exists(store.key("s", "pushes"), store.key("s", "push_ids"))
    assert store.flash_questions("s") == {} and store.events_after("s", None) == []


def test_publish_version_sets_current_and_both_streams(store):
    assert store.current_version("s") == 0
    event_id = store.publish_version("s", "t1", 7, rows_added=7, dropped_total=0)
    assert store.current_version("s") == 7
    assert store.events_after("s", None) == [(event_id, "data_updated",
                                              {"version": 7, "rows_added": 7, "dropped_total": 0,
                                               "lag_versions": 0, "lag_seconds": 0.0})]
    entries = store.read_versions("w1", count=10, block_ms=0)
    assert [(e.session_id, e.tenant, e.version, e.rows_added, e.dropped_total, e.lag_versions)
            for e in entries] == [("s", "t1", 7, 7, 0, 0)]
    # not newer: nothing changes, nothing is published
    assert store.publish_version("s", "t1", 7, 0, 0) is None
    assert store.publish_version("s", "t1", 3, 0, 0) is None
    assert store.current_version("s") == 7
    assert len(store.events_after("s", None)) == 1 and store.read_versions("w1", block_ms=0) == []


def test_events_resume_by_id_without_gap_or_duplicate(store):
    ids = [store.add_event("s", "rows_dropped", {"n": i}) for i in range(6)]
    first = store.events_after("s", None, count=3)
    assert [e.payload["n"] for e in first] == [0, 1, 2]
    rest = store.events_after("s", first[-1].id)
    assert [e.payload["n"] for e in rest] == [3, 4, 5] and [e.id for e in first + rest] == ids
    assert store.events_after("s", ids[-1]) == []
    assert store.latest_event_id("s") == ids[-1] and store.latest_event_id("none") == "0-0"
    with pytest.raises(ValueError):
        store.add_event("s", "bogus", {})
    for bad in ("abc", "1-2-3", "$", "1-"):
        with pytest.raises(InvalidInput):
            store.events_after("s", bad)
    assert [e.id for e in store.events_after("s", "0")] == ids


def test_events_after_blocks_until_one_arrives(store):
    start = store.latest_event_id("s")
    added: list[str] = []
    gate = threading.Event()

    def producer():
        gate.wait()
        added.append(store.add_event("s", "flash_ready", {"qid": "q1"}))

    t = threading.Thread(target=producer)
    t.start()
    gate.set()
    got = store.events_after("s", start, block_ms=3000)
    t.join()
    assert [e.id for e in got] == added and got[0].kind == "flash_ready"


def test_events_stream_is_bounded(store):
    for i in range(200):
        store.add_event("s", "data_updated", {"version": i})
    kept = store.client.xlen(store.key("s", "events"))
    assert 10 <= kept < 200  # MAXLEN ~ 10: trimmed by whole radix nodes
    assert store.events_after("s", None, count=1000)[-1].payload == {"version": 199}


def test_flash_registry_bound_and_dedup(store):
    q1 = store.register_flash("s", "  how many   orders? ")
    assert store.register_flash("s", "how many orders?") == q1  # same normalized text, same id
    q2 = store.register_flash("s", "total amount?")
    q3 = store.register_flash("s", "How many orders?")  # case matters: another question
    assert len({q1, q2, q3}) == 3
    with pytest.raises(FlashLimitExceeded) as info:
        store.register_flash("s", "fourth?")
    assert info.value.code == "RESOURCE_EXHAUSTED"
    assert store.flash_questions("s") == {q1: "how many orders?", q2: "total amount?", q3: "How many orders?"}
    assert store.delete_flash("s", q2) is True and store.delete_flash("s", q2) is False
    q4 = store.register_flash("s", "fourth?")  # room again
    assert [f["id"] for f in store.list_flash("s")] == [q1, q3, q4]
    assert store.register_flash("other", "fourth?") != "" and len(store.flash_questions("other")) == 1
    with pytest.raises(ValueError):
        store.register_flash("s", "   ")


def answer_at(question: str, version: int, sql: str = "SELECT 1") -> dict:
    return {"question": question, "version": version, "sql": sql, "rows": [[version]], "logit_gap": 1.0}


def test_store_answer_never_goes_back(store):
    qid = store.register_flash("s", "how many?")
    assert store.store_answer("s", qid, answer_at("how many?", 5)) is True
    assert store.store_answer("s", qid, answer_at("how many?", 5, "SELECT 2")) is False  # same version: once
    assert store.store_answer("s", qid, answer_at("how many?", 3)) is False  # older: never
    assert store.answer("s", qid)["version"] == 5 and store.answer("s", qid)["sql"] == "SELECT 1"
    assert store.store_answer("s", qid, answer_at("how many?", 9)) is True
    got = store.answer("s", qid)
    assert got["version"] == 9 and got["id"] == qid and got["computed_at"] > 0
    assert store.answer_versions("s") == {qid: 9}
    assert store.list_flash("s")[0]["answer"]["version"] == 9
    # a deleted question takes no answer (a worker finishing late does not resurrect it)
    store.delete_flash("s", qid)
    assert store.store_answer("s", qid, answer_at("how many?", 10)) is False and store.answer("s", qid) is None
    with pytest.raises(ValueError):
        store.store_answer("s", qid, {"version": "7"})


def test_lookup_never_returns_a_stale_answer(store):
    qid = store.register_flash("s", "how many?")
    assert store.lookup("s", "how many?", 4) is None  # no answer yet
    store.store_answer("s", qid, answer_at("how many?", 4))
    assert store.lookup("s", " how  many? ", 4)["version"] == 4  # normalized text matches
    assert store.lookup("s", "how many?", 5) is None  # the data moved on: stale, not served
    assert store.lookup("s", "how many?", 3) is None  # newer than the caller's data: not served either
    assert store.lookup("s", "How many?", 4) is None  # another question
    store.store_answer("s", qid, answer_at("how many?", 5))
    assert store.lookup("s", "how many?", 4) is None and store.lookup("s", "how many?", 5)["version"] == 5


def test_normalize_question_keeps_case_and_punctuation():
    assert normalize_question("\tHow  many\norders? ") == "How many orders?"


def test_consumer_group_read_ack_and_claim(store):
    for v in (1, 2, 3):
        store.publish_version("s", "t", v, 1, 0)
    got = store.read_versions("a", count=2, block_ms=0)
    assert [e.version for e in got] == [1, 2]
    store.ack_version(got[0].entry_id)
    assert store.num_pending_versions() == 1
    # "a" restarts under the same name: its unacked entry comes back first, new ones after
    assert [e.version for e in store.own_pending("a")] == [2]
    assert [e.version for e in store.read_versions("a", block_ms=0)] == [3]
    assert store.num_pending_versions() == 2
    # "a" is gone for good: "b" takes over what it left pending
    assert store.claim_versions("b", min_idle_ms=60_000) == []  # not idle long enough
    claimed = store.claim_versions("b", min_idle_ms=0)
    assert [e.version for e in claimed] == [2, 3]
    assert store.own_pending("a") == [] and [e.version for e in store.own_pending("b")] == [2, 3]
    for e in claimed:
        store.ack_version(e.entry_id)
    assert store.num_pending_versions() == 0
    info = {g["name"]: g for g in store.client.xinfo_groups(store.versions_key)}
    assert VERSIONS_GROUP in {n.decode() if isinstance(n, bytes) else n for n in info}


def test_trimmed_pending_entry_is_acked_not_returned(store):
    store.publish_version("s", "t", 1, 1, 0)
    (entry,) = store.read_versions("a", block_ms=0)
    store.client.xdel(store.versions_key, entry.entry_id)
    assert store.own_pending("a") == [] and store.num_pending_versions() == 0


def test_unreachable_redis_is_a_typed_error():
    dead = LiveStore(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=1.0)
    with pytest.raises(LiveStoreUnavailable) as info:
        dead.current_version("s")
    assert info.value.code == "UNAVAILABLE"


def test_store_answer_publishes_flash_ready_once(store):
    qid = store.register_flash("s", "how many?")
    start = store.latest_event_id("s")
    assert store.store_answer("s", qid, answer_at("how many?", 2), publish=True) is True
    assert store.store_answer("s", qid, answer_at("how many?", 2), publish=True) is False  # not stored: no event
    (event,) = store.events_after("s", start)
    assert event.kind == "flash_ready" and event.payload["id"] == qid and event.payload["version"] == 2
    assert event.payload == store.answer("s", qid)


def test_gone_consumers_with_nothing_pending_are_pruned(store):
    store.publish_version("s", "t", 1, 1, 0)
    store.publish_version("s", "t", 2, 1, 0)
    (entry,) = store.read_versions("busy", count=1, block_ms=0)  # "busy" holds a pending entry
    (done,) = store.read_versions("idle", count=1, block_ms=0)
    store.ack_version(done.entry_id)  # "idle" has nothing pending
    assert store.prune_consumers("me", min_idle_ms=3_600_000) == []  # nobody idle that long
    assert store.prune_consumers("idle", min_idle_ms=0) == []  # "idle" is the caller: kept
    assert store.prune_consumers("me", min_idle_ms=0) == ["idle"]  # "busy" keeps its entry
    store.ack_version(entry.entry_id)
    assert store.prune_consumers("me", min_idle_ms=0) == ["busy"]


def test_a_deleted_stream_gets_its_group_again(store):
    store.publish_version("s", "t", 1, 1, 0)
    assert [e.version for e in store.read_versions("a", block_ms=0)] == [1]
    store.client.delete(store.versions_key)  # FLUSHDB under a running worker
    assert store.own_pending("a") == [] and store.num_pending_versions() == 0
    store.client.delete(store.key("s", "version"))
    store.publish_version("s", "t", 2, 1, 0)
    assert [e.version for e in store.read_versions("a", block_ms=0)] == [2]


def test_a_version_with_pushes_behind_it_says_so(store):
    first = store.publish_version("s", "t1", 7, 7, 0)
    lagging = store.publish_version("s", "t1", 9, 2, 0, lag_versions=3, lag_seconds=1.25)
    assert store.events_after("s", first) == [(lagging, "data_updated", {
        "version": 9, "rows_added": 2, "dropped_total": 0, "lag_versions": 3, "lag_seconds": 1.25})]
    assert [(e.version, e.lag_versions) for e in store.read_versions("w1", count=10, block_ms=0)] == [(7, 0), (9, 3)]
