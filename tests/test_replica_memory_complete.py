"""Stateless completions on a replica hold a plateau, not a leak (issue 14's
soak: its gRPC Complete and REST /v1/complete callers). Cycles of prefix-mode
completions on four databases, a new question each time, several at once,
go through the replica's Complete path (start_complete on a thread, then the
generation event stream); after the first cycles (a P0 per database, prompt
builders) every count the probe takes must stop moving. No timing and no
RSS is asserted."""

from __future__ import annotations

import pytest

from bench.replica_memory import growth
from bench.replica_memory_complete import DBS, run_experiment
from headstart.engine.runtime import EngineRuntime
from services.engine.core import ReplicaCore

CYCLES = 6
PER_DB = 2
WARM = 2


@pytest.fixture
def core(tiny_runtime):
    settings = tiny_runtime.settings.model_copy(update={"table_cache": "off"})
    runtime = EngineRuntime(settings, loaded=tiny_runtime.loaded)
    core = ReplicaCore(settings, runtime=runtime)
    yield core
    core.shutdown()


def test_completions_on_several_dbs_reach_a_plateau(core):
    rows = run_experiment(core, CYCLES, DBS, per_db=PER_DB, max_new=4, concurrency=3)
    served = (CYCLES - WARM) * PER_DB * len(DBS)
    grown = growth(rows, WARM, settled=2)  # a leak shows in both last cycles
    assert [r["asked"] for r in rows[1:]] == [PER_DB * len(DBS)] * CYCLES
    assert len(core.runtime.p0_store.states()) == len(DBS)  # one P0 per database, shared by its completions
    for name in ("KVState", "PagedCache", "BlockTable", "GenerationRequest", "Job", "Task", "TextDeltas", "Thread",
                 "PromptBuilder", "num_threads", "num_tensors"):
        assert grown.get(name, 0) <= 0, (name, grown, rows[-1]["probe"])
    # a leak of one object per completion adds `served`; the cycles' noise is a few dozen
    assert grown["gc_objects"] < served, grown
    assert core.runtime.worker.num_queued == 0 and len(core.runtime.sessions) == 0
