"""The engine replicas' KV bytes and data-session lag on the gateway's /metrics.

Series `headstart_engine_kv_bytes{replica, kind}` with kind `used`, `shared`,
`budget`, `free` and `data` (the data sessions' part of `used`) (as the engine's Describe reports them; `free` only under
a budget), and `headstart_engine_kv_blocks{replica, kind}` with kind `used`, `shared` and `total`
(the replica's KV block pool, `headstart.engine.kv.block_pool`). The gateway learns them when scraped: it sends a few Describe
calls without a session id, which Serve's router spreads over the replicas
(each goes to the replica its random request id hashes to), and keeps each
replica's last answer for `STALE_S`, so a replica that no probe reached this
time still shows its recent numbers and one that is gone drops out.

The same answers carry each replica's data-session lag (headstart.data.lag),
labelled by replica only (never by session: bounded cardinality):
`headstart_engine_data_lag_versions_max`, `headstart_engine_data_lag_versions`
(the sum over sessions), `headstart_engine_data_lag_seconds_max`,
`headstart_engine_data_sessions_behind`, and the histogram
`headstart_engine_data_lag_seconds` of pushes' delays, acknowledged to handled.
"""

from __future__ import annotations

import asyncio
import time

import grpc
from prometheus_client import Gauge
from prometheus_client.core import HistogramMetricFamily

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


LAG_GAUGES = {
    "lag_versions_max": "acknowledged pushes the most-behind data session of each replica has not ingested yet",
    "lag_versions": "acknowledged pushes not ingested yet, summed over each replica's data sessions",
    "lag_seconds_max": "age of the oldest acknowledged push not ingested yet, per replica (0: caught up)",
    "sessions_behind": "data sessions of each replica with acknowledged pushes not ingested yet",
}


def info_lag(info: engine_pb2.EngineSessionInfo) -> dict[str, float]:
    """The lag gauges' values of one Describe answer, by LAG_GAUGES name."""
    return {"lag_versions_max": info.data_lag_versions_max, "lag_versions": info.data_lag_versions_sum,
            "lag_seconds_max": info.data_lag_seconds_max, "sessions_behind": info.data_sessions_behind}


class _LagHistogram:
    """`headstart_engine_data_lag_seconds{replica}`: each replica's histogram of push delays as its
    last Describe answer gave it (a collector: the counts are the replica's, not observed here)."""

    def __init__(self, gauges: "EngineKVGauges"):
        self.gauges = gauges

    def collect(self):
        family = HistogramMetricFamily("headstart_engine_data_lag_seconds", "delay of each acknowledged push "
                                       "until its rows were ingested, per replica", labels=["replica"])
        for replica, info in self.gauges.lag_histograms():
            if not info.data_lag_bucket_bounds_s:
                continue
            buckets = [(repr(float(b)), int(c)) for b, c in zip(info.data_lag_bucket_bounds_s,
                                                                 info.data_lag_bucket_counts)]
            buckets.append(("+Inf", int(info.data_lag_count)))
            family.add_metric([replica], buckets, float(info.data_lag_seconds_sum))
        yield family


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
        self.lag = {name: Gauge(f"headstart_engine_data_{name}", text, ["replica"], registry=registry)
                    for name, text in LAG_GAUGES.items()}
        registry.register(_LagHistogram(self))
        # replica -> (when, bytes, blocks, its Describe answer)
        self._seen: dict[str, tuple[float, dict[str, int], dict[str, int], engine_pb2.EngineSessionInfo]] = {}

    def record(self, info: engine_pb2.EngineSessionInfo, now: float | None = None) -> None:
        """Remember one replica's answer."""
        if info.replica:
            self._seen[info.replica] = (time.monotonic() if now is None else now, info_kv(info), info_blocks(info),
                                        info)

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
        for gauge in self.lag.values():
            gauge.clear()
        for replica, (when, values, blocks, info) in list(self._seen.items()):
            if now - when > STALE_S:
                del self._seen[replica]
                continue
            for kind, value in values.items():
                self.gauge.labels(replica, kind).set(value)
            for kind, value in blocks.items():
                self.blocks.labels(replica, kind).set(value)
            for name, value in info_lag(info).items():
                self.lag[name].labels(replica).set(value)

    def lag_histograms(self) -> list[tuple[str, engine_pb2.EngineSessionInfo]]:
        """(replica, its last answer) of the replicas published now (the lag histogram's source)."""
        return [(replica, info) for replica, (_, _, _, info) in self._seen.items()]
