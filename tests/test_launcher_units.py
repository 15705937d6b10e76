"""The local stack's defaults that need no Ray to check."""

from __future__ import annotations

import os

from services.launcher import default_replica_threads


def test_cpu_replicas_share_the_cores_and_cuda_ones_keep_torch_defaults(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    assert default_replica_threads("cpu", 1) == 4
    assert default_replica_threads("cpu", 2) == 2
    assert default_replica_threads("cpu", 3) == 1
    assert default_replica_threads("cpu", 8) == 1  # never zero
    assert default_replica_threads("cuda", 1) is None
    assert default_replica_threads("cuda:1", 2) is None
