"""The engine replicas' KV bytes on the gateway's /metrics.

Series `headstart_engine_kv_bytes{replica, kind}` with kind `used`, `shared`,
`budget`, `free` and `data` (the data sessions' part of `used`) (as the engine's Describe reports them; `free` only under
a budget), and `headstart_engine_kv_blocks{replica, kind}` with kind `used`, `shared` and `total`
(the replica's KV block pool, `headstart.engine.kv.block_pool`). The gateway learns them when scraped: it sends a few Describe
calls without a session id, which Serve's router spreads over the replicas
(each goes to the replica its random request id hashes to), and keeps each
replica's last answer for `STALE_S`, so a replica that no probe reached this
time still shows its recent numbers and one that is gone drops out.
"""

from __future__ import annotations

import asyncio
import time

import grpc
from prometheus_client import Gauge

from headstart.v1 import engine_pb2

PROBES_MIN = 4  # Describe calls per scrape, at least; twice the replicas seen so far
PROBE_TIMEOUT_S = 2.0
STALE_S = 120.0


def info_kv(info: engine_pb2.EngineSessionInfo) -> dict[str, int]:
    """The KV values by kind of one Describe answer (`free` only when the replica has a budget)."""
    values = {"used": info.kv_used_bytes, "shared": info.kv_shared_bytes, "budget": info.kv_budget_bytes,
              "data": info.kv_data_bytes}
    if info.HasField("kv_free_bytes"):
        values["free"] = info.kv_free_bytes
    return values


def info_blocks(info: engine_pb2.EngineSessionInfo) -> dict[str, int]:
    """The KV pool's blocks by kind of one Describe answer."""
    return {"used": info.kv_blocks_used, "shared": info.kv_blocks_shared, "total": info.kv_blocks_total}


class EngineKVGauges:
    """Args:
        registry: the gateway's Prometheus registry.
    """

    def __init__(self, registry):
        self.gauge = Gauge("headstart_engine_kv_bytes", "KV cache bytes of each engine replica by kind "
                           "(used, shared P0, budget, free under the budget, data sessions), as its Describe reports",
                           ["replica", "kind"], registry=registry)
        self.blocks = Gauge("headstart_engine_kv_blocks", "KV pool blocks of each engine replica by kind (used, "
                            "shared: listed by more than one cache, total: held by the pool), as its Describe "
                            "reports", ["replica", "kind"], registry=registry)
        self._seen: dict[str, tuple[float, dict[str, int], dict[str, int]]] = {}  # replica -> (when, bytes, blocks)

    def record(self, info: engine_pb2.EngineSessionInfo, now: float | None = None) -> None:
        """Remember one replica's answer."""
        if info.replica:
            self._seen[info.replica] = (time.monotonic() if now is None else now, info_kv(info), info_blocks(info))

    async def refresh(self, stub, metadata) -> None:
        """Probe the replicas (Describe without a session id), then set the gauges.

        A probe that fails (engine down, timeout) only leaves that replica's
        last numbers until they are stale: /metrics itself never fails on it."""
        probes = max(PROBES_MIN, 2 * len(self._seen))
        calls = [stub.Describe(engine_pb2.EngineSessionRef(), metadata=metadata, timeout=PROBE_TIMEOUT_S)
                 for _ in range(probes)]
        for answer in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(answer, engine_pb2.EngineSessionInfo):
                self.record(answer)
            elif not isinstance(answer, (grpc.RpcError, asyncio.TimeoutError, asyncio.CancelledError)):
                raise answer  # a bug, not the engine being away
        self.publish()

    def publish(self, now: float | None = None) -> None:
        """Set the gauges from the answers younger than STALE_S, drop the rest."""
        now = time.monotonic() if now is None else now
        self.gauge.clear()
        self.blocks.clear()
        for replica, (when, values, blocks) in list(self._seen.items()):
            if now - when > STALE_S:
                del self._seen[replica]
                continue
            for kind, value in values.items():
                self.gauge.labels(replica, kind).set(value)
            for kind, value in blocks.items():
                self.blocks.labels(replica, kind).set(value)
