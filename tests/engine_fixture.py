"""Engine fixtures: one float64 `random:tiny` runtime per test session.

float64 makes ties in the logits impossible, so "same tokens as a cold run"
cannot pass by luck or fail by rounding.
"""

from __future__ import annotations

import pytest

from headstart.engine.runtime import EngineRuntime


@pytest.fixture(scope="session")
def tiny_runtime(tmp_path_factory):
    runtime = EngineRuntime.from_settings(
        model="random:tiny", dtype="float64", p0_cache_dir=tmp_path_factory.mktemp("p0"),
        chunk_tokens=64, debounce_ms=0.0,
    )
    yield runtime
    runtime.shutdown()


@pytest.fixture(scope="module")
def trained_runtime(tmp_path_factory):
    """The trained 0.5B (`SMALL_MODEL`) as served (quantized GGUF weights, float32
    activations), one per test module: the default 1.5B's forwards cost two to three
    times as much, and what these tests check holds for both."""
    from headstart.models.catalogue import SMALL_MODEL

    runtime = EngineRuntime.from_settings(model=SMALL_MODEL, p0_cache_dir=tmp_path_factory.mktemp("p0"),
                                          chunk_tokens=64, threads=2)
    yield runtime
    runtime.shutdown()


def typed_then_submitted(runtime, db: str, question: str, step: int, max_new_tokens: int) -> list[int]:
    """An anticipatory session types `question` `step` characters at a time,
    settles, and submits it: the answer's token ids (the session is closed)."""
    from headstart.engine.requests.generation import SamplingParams

    session = runtime.open_session(db, "headstart")
    for seq, end in enumerate(range(step, len(question) + 1, step), 1):
        session.update(seq, question[:end])
    session.update(seq + 1, question)
    session.wait_idle(60)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    tokens = session.submit(seq + 2, question, params).result().token_ids
    runtime.close_session(session.session_id)
    return tokens
