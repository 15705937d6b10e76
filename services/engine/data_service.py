"""The data-session RPCs of one replica (engine.proto: DataOpen ... DataClose).

The Serve deployment's methods of those names call these; the tests host
them on a plain gRPC server. Every call is checked like the engine's other
calls (the engine secret; `headstart-tenant` names the tenant it works for)
and finds its session in the replica's `DataRegistry` by (id, tenant): a
session this replica does not hold for that tenant is NOT_FOUND "data
session not on this replica", and the gateway re-opens it with DataOpen and
the rows it holds.

`DataSession` calls block on the forward worker (opening, a query, an
evaluation) or tokenize (a push): they run on a thread pool of their own,
never on the replica's event loop, and never on asyncio's default pool that
the typing streams' calls use.

Errors are answered as gRPC statuses the way the other unary calls do (a
status set on the context and an empty reply, since Serve's proxy turns a
raised exception into INTERNAL): `InvalidInput` INVALID_ARGUMENT (naming the
row), the KV budget RESOURCE_EXHAUSTED, and so on (headstart.client.errors).
A push numbered below what the session has seen is SEQS_BEHIND with the
session's newest seq in trailing metadata (`headstart-last-seq`): the
gateway renumbers it above that and pushes again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable

from headstart.client.errors import CODE_METADATA_KEY, code_of, grpc_status, retry_metadata
from headstart.data import DataSession
from headstart.data.workcopy import SqlError
from headstart.engine.errors import LAST_SEQ_METADATA_KEY, InvalidInput, SeqsBehind
from headstart.engine.requests.generation import SamplingParams
from headstart.v1 import engine_pb2
from services.engine import data_wire
from services.engine.data_events import VersionPublisher
from services.engine.data_reconcile import DataReconciler
from services.engine.data_registry import DataRegistry
from services.engine.guard import EngineGuard, EngineUnauthenticated, tenant_of

log = logging.getLogger(__name__)
DEFAULT_MAX_NEW_TOKENS = 64
# Threads for blocking DataSession calls: each waits on the one forward worker,
# so more would only queue there; enough that queries and flash evaluations of
# many sessions wait in the worker's priority queue, not in this pool.
DATA_THREADS = 32


class DataService:
    """The data RPCs of a replica.

    Args:
        core: the replica's ReplicaCore (its runtime, and `data_sessions`, the registry).
        replica: this replica's id (reported in DataInfo).
        guard: the engine secret check.
        prepare: `await prepare(db)` -> the catalogue spec of `db`, its schema loaded.
        publisher: where version events go (None: no Redis configured).
    """

    def __init__(self, core, replica: str, guard: EngineGuard, prepare: Callable[[str], Awaitable[str]],
                 publisher: VersionPublisher | None = None):
        self.runtime, self.replica, self.guard, self.prepare = core.runtime, replica, guard, prepare
        self.registry: DataRegistry = core.data_sessions
        self.publisher = publisher
        # caches whose session Redis no longer has are dropped (services/engine/data_reconcile.py)
        self.reconciler = DataReconciler(self.registry, publisher.store) if publisher is not None else None
        self._pool = concurrent.futures.ThreadPoolExecutor(DATA_THREADS, thread_name_prefix="headstart-data")

    # -- RPCs -----------------------------------------------------------------------------

    async def DataOpen(self, request: engine_pb2.DataOpenRequest, grpc_context=None):  # noqa: N802
        async def run(tenant):
            if request.tenant and tenant and request.tenant != tenant:
                raise InvalidInput("the request's tenant is not the call's")
            tenant = tenant or request.tenant or None
            settings = data_wire.settings_from_wire(request.settings if request.HasField("settings") else None)
            rows = data_wire.rebuild_rows(request.rows)
            spec = await self.prepare(request.db)
            session, _ = await self._blocking(self.registry.open, request.session_id, tenant,
                                              lambda: self._build(request.session_id, spec, tenant, settings, rows))
            return data_wire.info(self.replica, session.describe())

        return await self._call(grpc_context, engine_pb2.DataInfo(), run)

    async def DataPush(self, request: engine_pb2.DataPushRequest, grpc_context=None):  # noqa: N802
        async def run(tenant):
            session = self.registry.get(request.session_id, tenant)
            rows, seqs = data_wire.rows_from_wire(request.rows)
            ack = await self._blocking(session.push, rows, seqs)
            return data_wire.push_reply(ack, session.data_version)

        return await self._call(grpc_context, engine_pb2.DataPushReply(), run)

    async def DataQuery(self, request: engine_pb2.DataQueryRequest, grpc_context=None):  # noqa: N802
        async def run(tenant):
            session = self.registry.get(request.session_id, tenant)
            return await self._blocking(self._query, session, request.question, _max_new(request.max_new_tokens),
                                        request.execute)

        return await self._call(grpc_context, engine_pb2.DataAnswer(), run)

    async def DataEvaluate(self, request: engine_pb2.DataEvaluateRequest, grpc_context=None):  # noqa: N802
        async def run(tenant):
            session = self.registry.get(request.session_id, tenant)
            if not request.questions:
                return engine_pb2.DataEvaluateReply(version=session.data_version)
            answers = await self._blocking(session.evaluate, list(request.questions),
                                           _max_new(request.max_new_tokens))
            return engine_pb2.DataEvaluateReply(version=answers[0].version if answers else session.data_version,
                                                answers=[data_wire.flash_answer(a) for a in answers])

        return await self._call(grpc_context, engine_pb2.DataEvaluateReply(), run)

    async def DataDescribe(self, request: engine_pb2.DataRef, grpc_context=None):  # noqa: N802
        async def run(tenant):
            return data_wire.info(self.replica, self.registry.get(request.session_id, tenant).describe())

        return await self._call(grpc_context, engine_pb2.DataInfo(), run)

    async def DataClose(self, request: engine_pb2.DataRef, grpc_context=None):  # noqa: N802
        """Idempotent: closing a session the replica does not hold answers holds=false."""
        async def run(tenant):
            session = self.registry.pop(request.session_id, tenant)
            if session is None:
                return data_wire.info(self.replica, None)
            await self._blocking(session.close)
            return data_wire.info(self.replica, session.describe())

        return await self._call(grpc_context, engine_pb2.DataInfo(), run)

    # -- the work ---------------------------------------------------------------------------

    def _build(self, session_id: str, spec: str, tenant: str | None, settings, rows) -> DataSession:
        """A new DataSession, rebuilt from `rows` when given (blocks until it is LIVE)."""
        on_version = self.publisher.listener(session_id, tenant) if self.publisher is not None else None
        on_failure = self.publisher.failure_listener(session_id) if self.publisher is not None else None
        return DataSession(self.runtime, spec, settings, session_id=session_id, tenant=tenant, rows=rows,
                           on_version=on_version, on_failure=on_failure, lag_histogram=self.registry.lag_histogram)

    @staticmethod
    def _query(session: DataSession, question: str, max_new_tokens: int, execute: bool) -> engine_pb2.DataAnswer:
        """Answer `question`; with `execute` run its SQL on the working copy at the answer's version."""
        result = session.query(question, max_new_tokens)
        columns, rows, error = (), (), ""
        if execute:
            if not result.sql.strip():
                error = "the answer has no SQL"
            else:
                try:
                    columns, rows = session.execute(result.sql, result.data_version)
                except SqlError as exc:
                    error = exc.message
        return data_wire.answer(question, result.data_version, result.text, result.sql, columns, rows, error,
                                data_wire.first_gap(result.first_logits), result.seconds,
                                result.speculative)

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args))

    async def _call(self, grpc_context, empty, run):
        """Check the secret, run `run(tenant)`; a failure becomes the call's status (and `empty`)."""
        metadata = list(grpc_context.invocation_metadata()) if grpc_context is not None else []
        trailing = []
        try:
            self.guard.check(metadata)
            return await run(tenant_of(metadata))
        except EngineUnauthenticated as exc:
            code, message = exc.code, exc.message
        except Exception as exc:
            code = code_of(exc)
            trailing.extend(retry_metadata(exc))  # INGESTION_BEHIND: when to push again
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            if code == "INTERNAL":
                log.exception("data call failed")
            if isinstance(exc, SeqsBehind):  # the gateway renumbers the push above it
                trailing.append((LAST_SEQ_METADATA_KEY, str(exc.last_seq)))
        if grpc_context is None:
            raise DataCallError(code, message)
        grpc_context.set_code(grpc_status(code))
        grpc_context.set_details(message)
        grpc_context.set_trailing_metadata([(CODE_METADATA_KEY, code), *trailing])
        return empty

    def shutdown(self) -> None:
        """Stop publishing, reconciling and the pool (the sessions are the core's: ReplicaCore.shutdown closes them)."""
        if self.reconciler is not None:
            self.reconciler.close()
        if self.publisher is not None:
            self.publisher.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _max_new(value: int) -> int:
    """A request's max_new_tokens (0: the default), in the range every engine call accepts."""
    params = SamplingParams(max_new_tokens=value or DEFAULT_MAX_NEW_TOKENS)
    params.validate()  # InvalidInput out of 1..4096, as Complete and typing submits
    return params.max_new_tokens


class DataCallError(Exception):
    """A data call made without a gRPC context (in-process callers) that failed: `code` and `message`."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message
