"""A session's candidates are charged to it: their copied-on-write KV blocks count in its budget.

The candidates decoded during a pause hold KV blocks of their own (each
candidate's answer tokens; the prompt's blocks are shared). Admission and
eviction (`kv.memory`) must see them, or a replica with candidates on
outgrows its budget unseen. float64 `random:tiny` (tests/engine_fixture.py).
"""

from __future__ import annotations

import time

from headstart.engine.kv.memory import KVMemory
from headstart.engine.requests.candidates import CandidateParams
from tests.typing_traces import QUESTIONS


def _own_bytes(state) -> int:
    own = sum(tokens for _, tokens, borrowed in state.cache.block_usage() if not borrowed)
    return own * state.token_bytes()


def test_a_session_is_charged_its_pause_candidates_blocks(tiny_runtime):
    session = tiny_runtime.open_session("world_1", "headstart",
                                        candidates=CandidateParams(4, temperature=1.0, seed=7))
    prompt_len = None

    def snapshot():
        """On the worker thread, between steps: nothing moves while it reads."""
        pause = session.candidates._set
        if pause is None or not pause.forked:
            return None
        running = [c.state for c in pause.sampled if c.state is not None]
        if not any(s.num_tokens > prompt_len for s in running):
            return None  # no candidate has written a token of its own yet
        states = session.kv_states
        memory = KVMemory(0, 1)
        return (states, running, memory.usage([states]), memory.usage([states[0]]),
                tiny_runtime.sessions.kv_usage(),
                memory.usage([s.kv_state for s in tiny_runtime.sessions._sessions.values()],
                             tiny_runtime.p0_store.states()))

    try:
        session.update(1, QUESTIONS[0])
        prompt_len = len(session.prompt.prompt_ids(QUESTIONS[0]))
        deadline = time.monotonic() + 60
        while (got := tiny_runtime.worker.run_sync(snapshot)) is None:
            assert time.monotonic() < deadline, "the pause's candidates never ran"
            time.sleep(0.002)
        states, running, with_cands, alone, table, table_without = got
        assert states[0] is session.kv_state and states[1:] == running
        candidate_bytes = sum(_own_bytes(s) for s in running)
        assert candidate_bytes > 0
        assert with_cands.session_bytes == alone.session_bytes + candidate_bytes
        assert with_cands.num_sessions == alone.num_sessions == 1  # one session, however many states
        # the replica's table (admission, eviction, Describe) counts them too
        assert table.session_bytes == table_without.session_bytes + candidate_bytes
    finally:
        tiny_runtime.close_session(session.session_id)
