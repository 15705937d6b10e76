"""The table-cache service's gRPC server: `headstart.v1.TableCache`, health, reflection.

A thread-pool server (the work is blocking: schema reads, model forwards,
Redis), plus one background thread for the periodic schema check and orphan
sweep. Errors carry a status a client can act on: INVALID_ARGUMENT (bad spec,
wrong model/mode, a schema that does not load), NOT_FOUND (not registered),
UNAVAILABLE (the block store cannot be reached).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from headstart.schema.model import SchemaError
from headstart.tables.layout import LayoutError
from headstart.tables.store import StoreError
from headstart.tables.store.base import StoreUnavailableError
from headstart.v1 import tablecache_pb2, tablecache_pb2_grpc
from services.tablecache.core import DatabaseStatus, NotRegisteredError, TableCacheCore, TableCacheError
from services.tablecache.settings import TableCacheSettings

log = logging.getLogger(__name__)

SERVICE_NAME = tablecache_pb2.DESCRIPTOR.services_by_name["TableCache"].full_name


def status_message(status: DatabaseStatus) -> tablecache_pb2.TableCacheDatabaseStatus:
    return tablecache_pb2.TableCacheDatabaseStatus(
        name=status.name, db_id=status.db_id, schema_hash=status.schema_hash, model=status.model,
        dtype=status.dtype, mode=status.mode, num_tables=status.num_tables, num_groups=status.num_groups,
        num_blocks=status.num_blocks, num_bytes=status.num_bytes, complete=status.complete,
        key_prefix=status.key_prefix)


@contextlib.contextmanager
def _status_codes(context: grpc.ServicerContext) -> Iterator[None]:
    """Map the core's exceptions onto gRPC status codes."""
    try:
        yield
    except NotRegisteredError as exc:
        context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    except StoreUnavailableError as exc:
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    except (TableCacheError, SchemaError, LayoutError) as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except StoreError as exc:
        context.abort(grpc.StatusCode.INTERNAL, str(exc))


class TableCacheServicer(tablecache_pb2_grpc.TableCacheServicer):
    """RPCs of `headstart.v1.TableCache` over a `TableCacheCore`."""

    def __init__(self, core: TableCacheCore) -> None:
        self.core = core

    def RegisterDatabase(self, request, context):  # noqa: N802 (gRPC method name)
        with _status_codes(context):
            return status_message(self.core.register(_spec(request.spec, context)))

    def Precompute(self, request, context):  # noqa: N802
        with _status_codes(context):
            spec = _spec(request.spec, context)
            for step in self.core.precompute(spec, model=request.model, dtype=request.dtype, mode=request.mode,
                                             force=request.force):
                if not context.is_active():  # the client left: stop between groups
                    return
                yield tablecache_pb2.TableCachePrecomputeProgress(
                    db_id=step.db_id, group_index=step.group_index, num_groups=step.num_groups,
                    tables=list(step.tables), num_tokens=step.num_tokens, num_bytes=step.num_bytes,
                    skipped=step.skipped, seconds=step.seconds)
            yield tablecache_pb2.TableCachePrecomputeProgress(status=status_message(self.core.status(spec)))

    def GetStatus(self, request, context):  # noqa: N802
        with _status_codes(context):
            return status_message(self.core.status(_spec(request.spec, context)))

    def ListDatabases(self, request, context):  # noqa: N802
        with _status_codes(context):
            return tablecache_pb2.TableCacheListReply(databases=[status_message(s) for s in self.core.list()])

    def Invalidate(self, request, context):  # noqa: N802
        with _status_codes(context):
            result = self.core.invalidate(_spec(request.spec, context))
            return tablecache_pb2.TableCacheInvalidateReply(
                changed=result.changed, old_schema_hash=result.old_schema_hash,
                new_schema_hash=result.new_schema_hash, num_blocks_deleted=result.num_blocks_deleted,
                status=status_message(result.status))

    def CleanOrphans(self, request, context):  # noqa: N802
        with _status_codes(context):
            if request.grace_s < 0:
                raise TableCacheError(f"grace_s must be >= 0, got {request.grace_s}")
            report = self.core.clean_orphans(request.grace_s)
            if report is None:
                return tablecache_pb2.TableCacheCleanOrphansReply()
            return tablecache_pb2.TableCacheCleanOrphansReply(
                num_index_entries_removed=report.num_index_entries_removed,
                num_payloads_removed=report.num_payloads_removed,
                num_payloads_kept_young=report.num_payloads_kept_young)


def _spec(spec: str, context) -> str:
    spec = spec.strip()
    if not spec:
        raise TableCacheError("spec is empty: give a Spider id, a SQLite path or a postgresql:// DSN")
    return spec


@dataclass
class RunningServer:
    """A started server; `stop()` stops it and the periodic checker."""

    server: grpc.Server
    port: int
    core: TableCacheCore
    _stop: threading.Event
    _checker: threading.Thread | None

    def stop(self, grace_s: float = 2.0) -> None:
        self._stop.set()
        self.server.stop(grace_s).wait()
        if self._checker is not None:
            self._checker.join(30)


def start_server(core: TableCacheCore, settings: TableCacheSettings, max_workers: int = 8) -> RunningServer:
    """Bind, start serving and start the periodic checker (when its interval is > 0)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tablecache"))
    tablecache_pb2_grpc.add_TableCacheServicer_to_server(TableCacheServicer(core), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{settings.host}:{settings.port}")
    if port == 0:
        raise OSError(f"cannot bind the table-cache server to {settings.host}:{settings.port}")
    server.start()
    for name in (SERVICE_NAME, ""):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    stop = threading.Event()
    checker = None
    if settings.check_interval_s > 0:
        checker = threading.Thread(target=_check_loop, args=(core, settings, stop), name="tablecache-check",
                                   daemon=True)
        checker.start()
    return RunningServer(server, port, core, stop, checker)


def _check_loop(core: TableCacheCore, settings: TableCacheSettings, stop: threading.Event) -> None:
    while not stop.wait(settings.check_interval_s):
        try:
            for result in core.check_all(precompute=settings.auto_precompute, grace_s=settings.orphan_grace_s):
                log.info("%s: schema changed %s -> %s, %d old blocks deleted", result.status.name,
                         result.old_schema_hash[:12], result.new_schema_hash[:12], result.num_blocks_deleted)
        except Exception as exc:  # the store may be down: try again next round
            log.warning("table-cache check failed: %s", exc)
