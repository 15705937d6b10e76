"""Flash evaluation and ready-position logits of data sessions (issue 12, part D):
evaluate == query == a cold prefill (float64, random:tiny), one snapshot per
call even when rows land in the middle, SQL executed at that version, and the
speculative exit on and off."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from headstart.data import flash_eval
from headstart.data import DataSettings
from headstart.data.answer import logit_gap
from headstart.data.ready import in_fast_vocabulary
from headstart.data.types import FAST_ANSWERS
from headstart.engine.errors import InvalidInput, ResourceExhausted
from headstart.engine.sched.forwards import run_rows
from tests.test_data_sessions import QUESTION, cold_answer, db, open_session, rows, runtime  # noqa: F401 (fixtures)
from tests.worker_gates import hold_worker

QUESTIONS = [QUESTION, "How many readings per sensor?", "Which sensor has the highest value?"]


def test_evaluate_equals_query_and_a_cold_prefill(runtime, db):
    session = open_session(runtime, db, retention_tokens=90, retention="rebuild", batch_rows=3)
    try:
        for i in range(4):
            session.push(rows(3 * i, 3))
            session.wait_idle()
        assert session.describe()["retired"] > 0  # retention rebuilt the cache: still exact
        answers = session.evaluate(QUESTIONS, max_new_tokens=10)
        context = session.context_ids()
        assert [a.question for a in answers] == QUESTIONS
        for answer, question in zip(answers, QUESTIONS):
            assert answer.version == session.data_version
            queried = session.query(question, 10)
            assert answer.token_ids == queried.token_ids and answer.text == queried.text
            tokens, first = cold_answer(runtime, context + session.prompt.question_ids(question), 10)
            assert answer.token_ids == tokens
            assert answer.logit_gap == pytest.approx(logit_gap(first), abs=1e-9)
            assert answer.error and answer.rows == []  # a random model's text is no SQL
        info = session.describe()
        assert (info["flash_evaluations"], info["flash_questions"]) == (1, 3)
        assert info["cache_tokens"] == len(context)  # the answers' tails are gone
        assert session.evaluate([]) == []
        with pytest.raises(InvalidInput):
            session.evaluate([QUESTION, "  "])
    finally:
        session.close()


def test_evaluate_answers_every_question_on_one_version(runtime, db, monkeypatch):
    """Rows ingested between two questions' steps (run inline on the worker, as
    a scheduler interleaving them would) do not reach the later answers: all
    name the first snapshot's version, and the SQL runs at it."""
    monkeypatch.setattr(flash_eval, "extract_sql", lambda text: "SELECT count(*) FROM readings")
    session = open_session(runtime, db, retention_tokens=4000)
    try:
        session.push(rows(0, 4))
        session.wait_idle()
        version, context = session.data_version, session.context_ids()
        step, seen = flash_eval._Run.step, {}

        def spy(run):
            if run.index == 1 and "ingested" not in seen and run.answers[0].done:
                session.push(rows(4, 3))  # rows arrive mid-evaluation and go into the live cache now
                more = True
                while more:  # every batch of them
                    row = session._ingest_step()
                    more = session._ingest_commit(row, run_rows([row], 1 << 20)[0][0])
                seen["ingested"] = session.data_version
            return step(run)

        monkeypatch.setattr(flash_eval._Run, "step", spy)
        answers = session.evaluate(QUESTIONS[:2], max_new_tokens=6)
        assert seen["ingested"] == session.data_version == 7 > version == 4
        assert {a.version for a in answers} == {version}
        assert [a.rows for a in answers] == [[(5,)], [(5,)]] and answers[0].columns == ["count(*)"]
        for answer, question in zip(answers, QUESTIONS):
            tokens, _ = cold_answer(runtime, context + session.prompt.question_ids(question), 6)
            assert answer.token_ids == tokens
        session.wait_idle()
        later = session.evaluate(QUESTIONS[:1], max_new_tokens=2)
        assert later[0].version == 7 and later[0].rows == [(8,)]
    finally:
        session.close()


def test_evaluate_runs_ahead_of_ingestion_and_queries(runtime, db):
    """FLASH outranks SUBMIT and STREAM: queued behind a held worker, the
    evaluation runs first and answers on the version before the waiting rows."""
    session = open_session(runtime, db, retention_tokens=4000)
    try:
        session.push(rows(0, 2))
        session.wait_idle()
        out = {}
        gate = hold_worker(runtime.worker)
        try:
            session.push(rows(2, 2))
            query = threading.Thread(target=lambda: out.update(query=session.query(QUESTION, 2)))
            query.start()
            flash = threading.Thread(target=lambda: out.update(flash=session.evaluate([QUESTION], 2)))
            flash.start()
            deadline = time.monotonic() + 10
            while len([j for j in runtime.worker.scheduler._waiting if j.name.startswith("data-")]) < 3:
                assert time.monotonic() < deadline, "the three jobs never queued"
                time.sleep(0.001)
        finally:
            gate.set()
        query.join(30)
        flash.join(30)
        assert out["flash"][0].version == 2
        assert out["query"].data_version == 2  # SUBMIT, also ahead of the rows' ingestion
    finally:
        session.close()


def test_ready_position_logits_and_the_speculative_exit(runtime, db):
    # the paper's fast-answer vocabulary, here the random model's ready word (a trained one's is "```")
    probe = open_session(runtime, db, retention_tokens=4000, ready_exit_gap=0.0)
    try:
        probe.push(rows(0, 3))
        probe.wait_idle()
        word = probe.ready_position().text
    finally:
        probe.close()
    assert word.strip(), f"the random model's ready token {word!r} is blank: pick other rows"
    session = open_session(runtime, db, retention_tokens=4000, ready_exit_gap=0.0, ready_exit_vocabulary={word})
    try:
        session.push(rows(0, 3))
        session.wait_idle()
        ready = session.ready_position()
        assert ready is not None and ready.version == session.data_version == 3 and ready.text == word
        cold = runtime.runner.prefill(session.context_ids() + session.prompt.ready_ids())
        assert torch.allclose(ready.logits, cold.last_logits, atol=1e-9, rtol=0)
        assert ready.token == int(torch.argmax(cold.last_logits)) and ready.token not in runtime.stop_ids
        quick = session.query(QUESTION, 8)
        assert quick.speculative and quick.token_ids == [ready.token] and quick.text == ready.text
        assert quick.data_version == 3 and quick.sql == ""  # a word, not SQL
        full = session.query(QUESTION, 8, allow_speculative=False)
        assert not full.speculative
        info = session.describe()
        assert info["ready_exits"] == 1 and info["ready_refreshes"] >= 1
        # a new version: the old position is never used; the refresh brings a new one
        gate = hold_worker(runtime.worker)
        try:
            session.push(rows(3, 1))
        finally:
            gate.set()
        session.wait_idle()
        assert session.ready_position().version == 4
    finally:
        session.close()


def test_a_ready_token_outside_the_fast_answers_is_no_answer(runtime, db):
    """Above any threshold, a top token that is not a fast answer (on a trained
    model the ready token opens SQL: "```", "SELECT") runs the query in full."""
    session = open_session(runtime, db, retention_tokens=4000, ready_exit_gap=0.0)
    try:
        session.push(rows(0, 3))
        session.wait_idle()
        ready = session.ready_position()
        assert ready is not None and not in_fast_vocabulary(ready.text)
        assert not session.query(QUESTION, 3).speculative
        assert session.describe()["ready_exits"] == 0
    finally:
        session.close()


@pytest.mark.parametrize("text, fast", [
    ("Yes", True), (" no", True), ("TRUE", True), (" Down", True), ("12", True), (" 7", True),
    ("```", False), ("SELECT", False), (" SELECT", False), ("Here", False), ("", False), (" ", False),
    ("-1", False), ("1.5", False), ("\uff11\uff12", False), ("yes!", False),
])
def test_fast_answers_are_one_word_verdicts_and_unsigned_integers(text, fast):
    assert in_fast_vocabulary(text) is fast


def test_the_vocabulary_is_a_setting():
    assert in_fast_vocabulary(" UP", DataSettings(ready_exit_vocabulary={" Up "}).ready_exit_vocabulary)
    assert not in_fast_vocabulary("yes", DataSettings(ready_exit_vocabulary={"up"}).ready_exit_vocabulary)
    assert DataSettings().ready_exit_vocabulary == FAST_ANSWERS
    for bad in ("yes", {"yes", " "}, {"yes", 1}):
        with pytest.raises(InvalidInput):
            DataSettings(ready_exit_vocabulary=bad)


def test_the_exit_is_off_by_default_and_above_its_threshold(runtime, db):
    off = open_session(runtime, db)
    high = open_session(runtime, db, ready_exit_gap=1e9)
    try:
        for session in (off, high):
            session.push(rows(0, 2))
            session.wait_idle()
            assert not session.query(QUESTION, 3).speculative
        assert off.ready_position() is None and off.describe()["ready_refreshes"] == 0  # nothing computed
        assert high.ready_position() is not None and high.describe()["ready_exits"] == 0
    finally:
        off.close()
        high.close()


@pytest.fixture()
def budget(runtime):
    """Set the runtime's KV budget (bytes) for one test; unbounded again after."""
    memory = runtime.kv_memory
    yield lambda n: setattr(memory, "budget_bytes", n)
    memory.budget_bytes = 0


def test_data_sessions_are_charged_to_the_kv_budget(runtime, db, budget):
    table, bpt = runtime.sessions, runtime.kv_memory.bytes_per_token
    before = table.kv_usage()
    session = open_session(runtime, db, retention_tokens=4000, retention="shift")
    try:
        session.push(rows(0, 2))
        session.wait_idle()
        usage, info = table.kv_usage(), session.describe()
        assert usage.num_data_sessions == before.num_data_sessions + 1
        assert usage.data_bytes - before.data_bytes == info["kv_bytes"] == info["cache_tokens"] * bpt
        assert usage.used_bytes == usage.session_bytes + usage.shared_bytes + usage.data_bytes
        # the charge: the cache and a reserve for a question and its answer
        assert info["kv_charged_bytes"] == info["kv_bytes"] + runtime.kv_memory.session_reserve_bytes
        # (the P0 the frozen region came from is stored now: shared, counted once)
        assert (usage.charged_bytes - usage.shared_bytes) - (before.charged_bytes - before.shared_bytes) \
            == info["kv_charged_bytes"]

        # a budget with room for 60 more tokens: another session does not fit, nor 4 more rows
        budget(usage.charged_bytes + 60 * bpt)
        with pytest.raises(ResourceExhausted, match="KV budget full"):
            open_session(runtime, db)
        assert table.kv_usage().num_data_sessions == usage.num_data_sessions  # the refused one is not held
        with pytest.raises(ResourceExhausted, match="KV budget full"):
            session.push(rows(2, 4))
        assert session.describe()["accepted"] == 2  # nothing of it was buffered
        ack = session.push(rows(2, 2))  # what fits goes in: the session is still usable
        session.wait_idle()
        result = session.query(QUESTION, 4)
        assert result.data_version == ack.seqs[-1] and result.rows_in_cache == 4
        assert result.token_ids == cold_answer(runtime, session.context_ids()
                                               + session.prompt.question_ids(QUESTION), 4)[0]
        assert table.kv_usage().charged_bytes <= usage.charged_bytes + 60 * bpt
    finally:
        budget(0)
        session.close()
    after = table.kv_usage()
    assert (after.num_data_sessions, after.data_bytes) == (before.num_data_sessions, before.data_bytes)


def test_rebuild_retention_is_charged_its_second_cache(runtime, db, budget):
    """With `rebuild` retention, rows past the bound are charged a rebuild of
    frozen + the bound beside the live cache, before it starts."""
    session = open_session(runtime, db, retention_tokens=60, retention="rebuild")
    try:
        bpt, reserve = runtime.kv_memory.bytes_per_token, runtime.kv_memory.session_reserve_bytes
        charge = session._charge
        assert charge.charged_bytes() == session.frozen_tokens * bpt + reserve
        grown = charge.charged_bytes(100)  # 100 tokens of rows: over the bound of 60
        assert grown == (session.frozen_tokens + 100) * bpt + (session.frozen_tokens + 60) * bpt + reserve
        session.push(rows(0, 6))
        session.wait_idle()
        info = session.describe()
        assert info["rebuilds"] >= 1 and info["kv_charged_bytes"] >= info["kv_bytes"]
    finally:
        session.close()


def test_a_data_session_evicts_an_idle_typing_session_to_fit(runtime, db, budget):
    """The typing sessions' rule: past the budget, idle typing sessions go
    (least recently used first) before a data session is refused."""
    probe = open_session(runtime, db)
    need = probe.describe()["kv_charged_bytes"]
    probe.close()
    typing = runtime.open_session(db)
    evicted = runtime.sessions.evicted
    try:
        budget(runtime.sessions.kv_usage().charged_bytes + need - 1)  # fits only without the typing session
        session = open_session(runtime, db)
        try:
            assert typing.closed and runtime.sessions.evicted == evicted + 1
            assert runtime.sessions.kv_usage().charged_bytes <= runtime.kv_memory.budget_bytes
        finally:
            session.close()
    finally:
        budget(0)
        runtime.close_session(typing.session_id)
