"""Integration (issue 45): the engine replicas of a stack `start_ray` starts run at niceness 0.

Ray's raylet starts worker processes at niceness 15 by default; an engine
replica (the model and every session) then yields the CPU to the gateway, the
flash worker and any neighbour, and its data sessions fell behind their pushes
under load. The real stack of tests/serve_fixture.py runs its replicas as
children of this process: each must run at the priority of the process that
started Ray.
"""

from __future__ import annotations

import os

import grpc
import pytest

from headstart.v1 import engine_pb2, engine_pb2_grpc

pytestmark = pytest.mark.slow

psutil = pytest.importorskip("psutil")


def _replica_processes() -> list:
    found = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "ServeReplica" in " ".join(child.cmdline()) or child.name().startswith("ray::ServeReplica"):
                found.append(child)
        except psutil.Error:  # exited meanwhile
            continue
    return found


def test_engine_replicas_run_at_the_starters_priority(serve_engine):
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        for i in range(4):
            stub.Describe(engine_pb2.EngineSessionRef(), metadata=serve_engine.metadata(f"nice-{i}"), timeout=30)
    replicas = _replica_processes()
    assert replicas, "no Serve replica process found among this process's children"
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert {p.nice() for p in replicas} == {mine}, [(p.pid, p.nice()) for p in replicas]
