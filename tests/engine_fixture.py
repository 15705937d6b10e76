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
