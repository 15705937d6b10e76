"""A replica's KV bytes as Ray Serve metrics (the replica's Prometheus series).

Ray exports a replica's `ray.serve.metrics` on its node's metrics port
(`ray_<name>` with the tags `deployment`, `replica`, `application`; the port
Prometheus or KubeRay's PodMonitor scrapes on a Ray pod). The series:

    ray_headstart_engine_kv_bytes{kind="used"|"shared"|"budget"|"free"|"data"}
    ray_headstart_engine_data_sessions
    ray_headstart_engine_kv_blocks{kind="used"|"shared"|"total"}
    ray_headstart_engine_data_lag_versions_max, ray_headstart_engine_data_lag_seconds_max

`data`: the part of `used` the data sessions hold (issue 12: live caches, a
rebuild in flight, answers' tails), and the second series how many data
sessions the replica holds.

`used`: every cache of the replica (each shared P0 once, plus the sessions'
private tokens), `shared`: the P0 part of it, `budget`: HEADSTART_KV_BUDGET_BYTES
(0: no byte bound), `free`: what is left under the budget (not reported when
unbounded). The same numbers are in the engine's Describe
(EngineSessionInfo.kv_*) and, per replica, on the gateway's /metrics.
The blocks are the pool's (`headstart.engine.kv.block_pool`): `used` listed by
a cache, `shared` by more than one (a P0 and the sessions on it), `total`
the blocks the pool holds memory for.
"""

from __future__ import annotations

from headstart.engine.kv.memory import KVUsage

METRIC_NAME = "headstart_engine_kv_bytes"
DATA_SESSIONS_METRIC = "headstart_engine_data_sessions"
BLOCKS_METRIC = "headstart_engine_kv_blocks"
# the data sessions' ingestion lag (headstart.data.lag): the most-behind session's, never per session
LAG_VERSIONS_METRIC = "headstart_engine_data_lag_versions_max"
LAG_SECONDS_METRIC = "headstart_engine_data_lag_seconds_max"
KINDS = ("used", "shared", "budget", "free", "data")


def block_values(usage: KVUsage) -> dict[str, int]:
    """The block gauge's values of one `KVUsage` by kind."""
    return {"used": usage.blocks_used, "shared": usage.blocks_shared, "total": usage.blocks_total}


def kv_values(usage: KVUsage) -> dict[str, int]:
    """The gauge values of one `KVUsage` by kind (`free` only under a budget)."""
    values = {"used": usage.used_bytes, "shared": usage.shared_bytes, "budget": usage.budget_bytes,
              "data": usage.data_bytes}
    if usage.free_bytes is not None:
        values["free"] = usage.free_bytes
    return values


class ReplicaKVGauge:
    """One Serve gauge, tag `kind`; `record` sets it from a `KVUsage`."""

    def __init__(self):
        from ray.serve.metrics import Gauge

        self._gauge = Gauge(METRIC_NAME, description="KV cache bytes of this engine replica, by kind "
                            "(used, shared P0, budget, free under the budget, data sessions)", tag_keys=("kind",))
        self._data_sessions = Gauge(DATA_SESSIONS_METRIC, description="data sessions open on this engine replica")
        self._blocks = Gauge(BLOCKS_METRIC, description="KV pool blocks of this engine replica, by kind (used, "
                             "shared: listed by more than one cache, total: held by the pool)", tag_keys=("kind",))
        self._lag_versions = Gauge(LAG_VERSIONS_METRIC, description="acknowledged pushes the most-behind data "
                                   "session of this replica has not ingested yet")
        self._lag_seconds = Gauge(LAG_SECONDS_METRIC, description="age of the oldest acknowledged push not "
                                  "ingested yet on this replica (0: caught up)")

    def record(self, usage: KVUsage) -> None:
        for kind, value in kv_values(usage).items():
            self._gauge.set(value, tags={"kind": kind})
        for kind, value in block_values(usage).items():
            self._blocks.set(value, tags={"kind": kind})
        self._data_sessions.set(usage.num_data_sessions)

    def record_lag(self, summary) -> None:
        """Set the lag gauges from the replica's `LagSummary` (headstart.data.lag)."""
        self._lag_versions.set(summary.max_versions)
        self._lag_seconds.set(summary.max_seconds)
