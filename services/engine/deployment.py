"""The engine as a Ray Serve deployment, reached through Serve's gRPC proxy.

Each replica owns a `ReplicaCore` (model, forward worker, sessions). Calls
carry `session_id` metadata; `ConsistentHashRouter` maps it to a replica, so
every call of a session lands where its cache is. When that replica dies the
ring moves the session to another one, which rebuilds it from the gateway's
next attach (correct, only slower).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from headstart.config import EngineSettings
from headstart.engine.requests.generation import SamplingParams
from headstart.heap import trim_heap
from headstart.v1 import engine_pb2
from services.engine import events
from services.engine.checks import answer_events, candidates_of
from services.engine.core import ReplicaCore
from services.engine.completes import CompleteRegistry
from services.engine.data_events import VersionPublisher
from services.engine.data_service import DataService
from services.engine.direct import start_direct_ingress
from services.engine.generate import start_cancellable
from services.engine.guard import EngineGuard, EngineUnauthenticated, configured_secret, tenant_of
from services.engine.heap_trim import HeapTrimmer
from services.engine.kv_metrics import ReplicaKVGauge, block_values, kv_values
from services.engine.loader import SchemaLoader
from services.engine.stream import SessionStream, sampling_params

log = logging.getLogger(__name__)
APP_NAME = "headstart-engine"
ROUTER_CLASS = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"
# Functions the Serve gRPC proxy registers: our API plus standard health checking
# (Check/Watch are answered by a replica, so SERVING means a replica is up).
SERVICER_FUNCTIONS = [
    "headstart.v1.engine_pb2_grpc.add_EngineServicer_to_server",
    "grpc_health.v1.health_pb2_grpc.add_HealthServicer_to_server",
]
# Streams beyond admission that Serve may still queue (Describe, Close, Complete).
ONGOING_HEADROOM = 64


@serve.deployment(name="Engine", graceful_shutdown_timeout_s=5, health_check_period_s=5)
class EngineDeployment:
    """One engine replica. Method names are the RPC names of `headstart.v1.Engine`."""

    def __init__(self, settings: dict[str, Any], max_attached: int | None = None, secret: str | None = None,
                 catalogue: dict[str, Any] | None = None):
        engine_settings = EngineSettings(**settings)
        self.core = ReplicaCore(engine_settings, max_attached)
        self.replica = serve.get_replica_context().replica_id.to_full_id_str()
        # which kernels this replica's forwards run (`auto` times them at start): in the replica's log,
        # through Ray Serve's logger (the headstart loggers are not configured in a replica)
        logging.getLogger("ray.serve").info("headstart fast path: %s", self.core.runtime.fast_path_choice.summary())
        self.guard = EngineGuard(configured_secret(secret), build_catalogue(engine_settings, catalogue))
        self.completes = CompleteRegistry()  # running Completes by request id (CancelComplete)
        self.loader = SchemaLoader(self.core.runtime.prompt_for)
        self.kv_gauge = ReplicaKVGauge()
        self.heap_trimmer = HeapTrimmer(engine_settings.malloc_trim_s)
        worker = self.core.runtime.worker
        self.heap_trimmer.start(self.core.idle, lambda: worker.steps_run)  # once a burst's forwards end
        publisher = VersionPublisher.from_url(engine_settings.redis_url) if engine_settings.redis_url else None
        self.data = DataService(self.core, self.replica, self.guard, self._prepare, publisher)
        # Session streams past Serve's proxy (services/engine/direct.py); None: off or unbindable
        self.direct = start_direct_ingress(self._session_events)
        logging.getLogger("ray.serve").info("headstart direct ingress: %s",
                                            self.direct.target if self.direct else "off (sessions via the proxy)")
        trim_heap()  # what loading and warming up freed, before the first request (headstart.heap)

    async def _prepare(self, db: str) -> str:
        """The spec of catalogue name `db`, its schema loaded (raises UnknownDatabase / DatabaseUnavailable)."""
        spec = self.guard.spec(db)
        await self.loader.ensure(spec, db)
        return spec

    async def Session(self, request_stream, grpc_context=None):  # noqa: N802 (gRPC method name)
        async for event in self._session_events(request_stream, _metadata(grpc_context)):
            yield event

    async def _session_events(self, requests, metadata: list[tuple[str, str]]):
        """One session stream, through the proxy (`Session`) or the direct port alike."""
        try:
            self.guard.check(metadata)
        except EngineUnauthenticated as exc:
            yield events.error(exc.code, exc.message)
            return
        stream = SessionStream(self.core, self.replica, self._prepare, tenant=tenant_of(metadata))
        async with contextlib.aclosing(stream.run(requests)) as stream_events:
            async for event in stream_events:
                yield event

    async def Locate(self, request: engine_pb2.EngineSessionRef, grpc_context=None):  # noqa: N802
        """This replica (Serve routed the call here by `session_id`) and its direct address."""
        if not _allowed(self.guard, grpc_context):
            return engine_pb2.EngineLocation()
        return engine_pb2.EngineLocation(replica=self.replica, direct_target=self.direct.target if self.direct else "")

    async def Complete(self, request: engine_pb2.EngineCompleteRequest, grpc_context=None):  # noqa: N802
        tables = list(request.tables) or None  # empty: the whole schema
        try:
            self.guard.check(_metadata(grpc_context))
        except EngineUnauthenticated as exc:
            yield events.error(exc.code, exc.message)
            return
        rid = request.request_id
        if rid and not self.completes.begin(rid):  # its client left before it came (CancelComplete)
            yield events.error("CANCELLED", "the client left before the request arrived")
            return
        try:
            try:
                spec = await self._prepare(request.db)
                params: SamplingParams = sampling_params(request.params)
                candidates = candidates_of(request.candidates, self.core.runtime.settings)
                tenant = tenant_of(_metadata(grpc_context))
                gen = await start_cancellable(lambda: self.core.runtime.start_complete(
                    spec, request.question, request.mode or "prefix", params, tables=tables, tenant=tenant,
                    candidates=candidates))
            except Exception as exc:
                yield events.from_exception(exc)
                return
            if rid:
                self.completes.started(rid, gen)
            decode = self.core.runtime.prompt_for(spec, tables).decode
            async for event in answer_events(gen, decode, self.replica, 0, self.core.checks, spec,
                                             request.check_limits, request.candidates.wait_all):
                yield event
        finally:
            if rid:
                self.completes.end(rid)

    async def CancelComplete(self, request: engine_pb2.CompleteRef, grpc_context=None):  # noqa: N802
        """Stop a Complete by its request id, or refuse it when it comes (services/engine/completes.py)."""
        if not _allowed(self.guard, grpc_context):
            return engine_pb2.CancelReply()
        return engine_pb2.CancelReply(found=self.completes.cancel(request.request_id))

    async def Describe(self, request: engine_pb2.EngineSessionRef, grpc_context=None):  # noqa: N802
        if not _allowed(self.guard, grpc_context):
            return engine_pb2.EngineSessionInfo()
        return self._info(request.session_id)

    async def CloseSession(self, request: engine_pb2.EngineSessionRef, grpc_context=None):  # noqa: N802
        if not _allowed(self.guard, grpc_context):
            return engine_pb2.EngineSessionInfo()
        self.core.close(request.session_id)
        return self._info(request.session_id)

    # Data sessions (issue 12): services/engine/data_service.py. Serve's proxy
    # calls the deployment's method of the RPC's name, so each is named here.
    async def DataOpen(self, request, grpc_context=None):  # noqa: N802
        return await self.data.DataOpen(request, grpc_context)

    async def DataPush(self, request, grpc_context=None):  # noqa: N802
        return await self.data.DataPush(request, grpc_context)

    async def DataQuery(self, request, grpc_context=None):  # noqa: N802
        return await self.data.DataQuery(request, grpc_context)

    async def DataEvaluate(self, request, grpc_context=None):  # noqa: N802
        return await self.data.DataEvaluate(request, grpc_context)

    async def DataDescribe(self, request, grpc_context=None):  # noqa: N802
        return await self.data.DataDescribe(request, grpc_context)

    async def DataClose(self, request, grpc_context=None):  # noqa: N802
        return await self.data.DataClose(request, grpc_context)

    async def Check(self, request):  # noqa: N802 (grpc.health.v1)
        from grpc_health.v1 import health_pb2

        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(self, request):  # noqa: N802 (grpc.health.v1)
        yield await self.Check(request)

    def memory_probe(self, detail: bool = False, trim: bool = False, trace: bool = False) -> dict:
        """What this replica holds, counted (services/engine/memory_probe.py), plus its sessions
        and glibc's account of its heap (bytes in use, free bytes kept).

        A diagnostic for leak experiments (bench/replica_memory_serve.py) and
        the load tests' memory sampler. Reached only through a Serve handle
        inside the Ray cluster: Serve's gRPC proxy routes only the Engine and
        Health RPCs, and no RPC has this name.

        Args:
            detail: also live objects by type name, threads by name, CPython's
                allocated blocks, the replica's tables' sizes and the
                Prometheus samples of this process.
            trim: also RSS after glibc's `malloc_trim(0)`, which gives free heap
                pages back (it changes what later readings see).
            trace: start tracemalloc at the first such call; later ones add the
                source lines whose Python allocations grew most since the last.
        """
        from services.engine import memory_probe as probe

        out = probe.snapshot().as_dict() | {"num_sessions": len(self.core.runtime.sessions),
                                             "evicted": self.core.runtime.sessions.evicted,
                                             "malloc": probe.malloc_stats(), "pid": os.getpid(),
                                             "heap_trims": self.heap_trimmer.num_trims,
                                             "kv": dataclasses.asdict(self.core.runtime.sessions.kv_usage()),
                                             "kv_bytes_per_token": self.core.runtime.kv_memory.bytes_per_token}
        if detail:
            out |= {"type_counts": probe.type_counts(), "thread_names": probe.thread_names(),
                    "allocated_blocks": probe.allocated_blocks(), "tables": replica_tables(self.core),
                    "prometheus_samples": probe.prometheus_samples()}
        if trim:
            out["rss_trimmed_mib"] = probe.malloc_trim()
        if trace:
            self._traced, out["traced_growth"] = probe.traced_growth(getattr(self, "_traced", None))
        return out

    def check_health(self) -> None:
        """Serve's replica health check: the forward worker thread must be alive.

        Serve calls it every `health_check_period_s` (5 s): the replica's KV
        gauge is refreshed here, so its metric is never older than that."""
        if not self.core.runtime.worker.is_alive():
            raise RuntimeError("forward worker thread died")
        try:
            self.kv_gauge.record(self.core.kv_usage())
            self.kv_gauge.record_lag(self.core.data_sessions.lag_summary())
        except Exception:  # NOTE: a metric must never fail the health check (Serve would restart the replica)
            log.exception("KV gauge not recorded")

    def _info(self, session_id: str) -> engine_pb2.EngineSessionInfo:
        info = self.core.info(session_id)
        return engine_pb2.EngineSessionInfo(
            replica=self.replica, holds_session=info.holds_session, num_sessions=info.num_sessions,
            num_attached=info.num_attached, num_queued=info.num_queued, seq=info.seq,
            cached_tokens=info.cached_tokens, num_data_sessions=info.num_data_sessions,
            forward_tokens=info.forward_tokens, **kv_fields(info.kv), **lag_fields(self.core.data_sessions),
        )

    def __del__(self):
        try:
            if getattr(self, "direct", None) is not None:
                self.direct.stop()
            self.heap_trimmer.stop()
            self.loader.shutdown()
            self.data.shutdown()
            self.core.shutdown()
        except Exception:
            pass


def replica_tables(core: ReplicaCore) -> dict[str, int]:
    """Sizes of the per-session and per-request structures of a replica (leak diagnostics)."""
    runtime, worker = core.runtime, core.runtime.worker
    scheduler = worker.scheduler
    return {"sessions": len(runtime.sessions), "kv_holders": runtime.sessions.num_holders,
            "attached": core.num_attached, "data_sessions": len(core.data_sessions),
            "prompt_builders": runtime.num_prompt_builders, "p0_states": len(runtime.p0_store.states()),
            "queued_jobs": worker.num_queued, "running_jobs": worker.num_running,
            "tenants_served": scheduler.num_tenants_served}


def lag_fields(registry) -> dict:
    """EngineSessionInfo's data-lag fields of a replica's `DataRegistry` (headstart.data.lag)."""
    summary = registry.lag_summary()
    counts, total, count = registry.lag_histogram.snapshot()
    return dict(data_lag_versions_max=summary.max_versions, data_lag_versions_sum=summary.sum_versions,
                data_lag_seconds_max=summary.max_seconds, data_sessions_behind=summary.sessions_behind,
                data_lag_bucket_bounds_s=list(registry.lag_histogram.buckets), data_lag_bucket_counts=counts,
                data_lag_seconds_sum=total, data_lag_count=count)


def kv_fields(usage) -> dict[str, int]:
    """EngineSessionInfo's KV fields of a `KVUsage` (kv_free_bytes left unset when unbounded)."""
    if usage is None:
        return {}
    return {f"kv_{kind}_bytes": value for kind, value in kv_values(usage).items()} | {
        "kv_block_tokens": usage.block_tokens,
        **{f"kv_blocks_{kind}": value for kind, value in block_values(usage).items()}}


def _metadata(grpc_context) -> list[tuple[str, str]]:
    return list(grpc_context.invocation_metadata()) if grpc_context is not None else []


def _allowed(guard: EngineGuard, grpc_context) -> bool:
    """Unary calls: False after setting an UNAUTHENTICATED status on the context.

    NOTE: the status must be set and the call must *return*: Serve's proxy
    copies a returned call's context code to the client, but turns a raised
    exception into INTERNAL."""
    try:
        guard.check(_metadata(grpc_context))
        return True
    except EngineUnauthenticated as exc:
        if grpc_context is None:
            raise
        import grpc

        grpc_context.set_code(grpc.StatusCode.UNAUTHENTICATED)
        grpc_context.set_details(exc.message)
        return False


def build_catalogue(settings: EngineSettings, config: dict[str, Any] | None):
    """The replica's catalogue: from `config` (Catalogue's keyword arguments) or the environment."""
    from headstart.schema.catalogue import Catalogue

    if config is None:
        return Catalogue.from_env(settings.spider_dir)
    return Catalogue(**{"spider_dir": settings.spider_dir, **config})


def engine_app(settings: EngineSettings, num_replicas: int = 2, max_attached: int | None = None,
               num_cpus: float = 0.0, num_gpus: float = 0.0, secret: str | None = None,
               catalogue: dict[str, Any] | None = None, resources: dict[str, float] | None = None):
    """The bound Serve application: `num_replicas` sticky replicas of the engine.

    `secret`: what callers must send (see services/engine/guard.py; None: the
    replica's environment). `catalogue`: Catalogue keyword arguments (None: the
    replica's environment, `Catalogue.from_env`). `resources`: Ray custom
    resources each replica asks for (its placement on a cluster's nodes)."""
    max_attached = max_attached or settings.max_sessions
    deployment = EngineDeployment.options(
        num_replicas=num_replicas,
        max_ongoing_requests=max_attached + ONGOING_HEADROOM,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus,
                           **({"resources": resources} if resources else {})},
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            # NOTE: no fallback to another replica under backpressure: that would
            # silently move a session (and rebuild its cache) on every busy moment.
            request_router_kwargs={"num_fallback_replicas": 0},
        ),
    )
    return deployment.bind(settings.model_dump(), max_attached, secret, catalogue)
