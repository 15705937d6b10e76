"""The public gRPC server (`headstart.v1.Headstart`), with health and reflection.

Authentication: metadata `authorization: Bearer <token>`. Unary failures are
gRPC statuses with the exact code in trailing metadata `headstart-error-code`;
inside a Type stream a failure is an `Error` message and the stream goes on.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from headstart.client.errors import CODE_METADATA_KEY, ApiError, grpc_status, retry_metadata
from headstart.v1 import engine_pb2, headstart_pb2, headstart_pb2_grpc, types_pb2
from services.gateway.data_grpc import DataServicerMixin
from services.gateway.grpc_wire import WIRE_CEILING, add_headstart_servicer, checked, sampling_of
from services.gateway.limits import RateLimiter
from services.gateway.service import GatewayService
from services.gateway.sessions import TAKEN_OVER

EDGE = "grpc"
SERVICE_NAME = headstart_pb2.DESCRIPTOR.services_by_name["Headstart"].full_name
_INPUT_DONE = object()


def to_type_response(event: engine_pb2.EngineEvent) -> headstart_pb2.TypeResponse | None:
    kind = event.WhichOneof("kind")
    if kind in ("progress", "tokens", "result", "error", "choice"):
        return headstart_pb2.TypeResponse(**{kind: getattr(event, kind)})
    return None


def _error_event(exc: ApiError) -> engine_pb2.EngineEvent:
    return engine_pb2.EngineEvent(error=types_pb2.Error(code=exc.code, message=exc.message, seq=exc.seq))


class _Pending:
    """The seq of the submit a Type stream still owes a result (or, after a Result with
    num_candidates > 1, a Choice) for (0: none)."""

    seq: int = 0


class HeadstartServicer(DataServicerMixin, headstart_pb2_grpc.HeadstartServicer):
    def __init__(self, service: GatewayService):
        self.service = service

    async def _abort(self, context: grpc.aio.ServicerContext, exc: ApiError):
        self.service.metrics.errors.labels(EDGE, exc.code).inc()
        await context.abort(grpc_status(exc.code), exc.message,
                            trailing_metadata=((CODE_METADATA_KEY, exc.code), *retry_metadata(exc)))

    def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        return self.service.auth.tenant(dict(context.invocation_metadata()).get("authorization"))

    async def Type(self, request_iterator, context):  # noqa: N802
        """A typing stream, counted in its tenant's connection share from authentication to its end."""
        try:
            tenant = self._tenant(context)
            self.service.quotas.connections.acquire(tenant)
        except ApiError as exc:
            await self._abort(context, exc)
            return
        try:
            async for response in self._type(request_iterator, context, tenant):
                yield response
        finally:
            self.service.quotas.connections.release(tenant)

    async def _type(self, request_iterator, context, tenant: str):
        try:
            first = await self._first(request_iterator)
            sid = first.open.session_id
            candidates = first.open.candidates if first.open.HasField("candidates") else None
            session = self.service.get(tenant, sid) if sid else await self.service.open(tenant, first.open.db, True,
                                                                                         candidates)
        except ApiError as exc:
            await self._abort(context, exc)
            return
        # A session has one listener: attaching takes it over (the previous stream gets SESSION_MOVED).
        events = session.attach_listener() if sid else session.listener
        reader = None
        input_done = taken_over = False
        try:
            # NOTE: inside the try: a client that cancels now (the stream is closed at this
            # yield) must have its session closed all the same (issue 29: they leaked)
            yield headstart_pb2.TypeResponse(ready=headstart_pb2.Ready(session_id=session.session_id, db=session.db))
            pending = _Pending()
            reader = asyncio.create_task(self._read(request_iterator, session, pending, events))
            # Runs until the client half-closes and no submit awaits its result.
            while not (input_done and not pending.seq):
                event = await events.get()
                if event is _INPUT_DONE:
                    input_done = True
                    continue
                if event is TAKEN_OVER:
                    taken_over = True
                    self.service.metrics.errors.labels(EDGE, "SESSION_MOVED").inc()
                    yield headstart_pb2.TypeResponse(error=types_pb2.Error(
                        code="SESSION_MOVED", message="another connection attached to this session"))
                    return
                kind = event.WhichOneof("kind")
                if kind == "result" and event.result.num_candidates > 1:
                    pass  # its Choice is still owed
                elif kind in ("result", "choice") or (kind == "error" and event.error.seq == pending.seq):
                    pending.seq = 0
                elif kind == "error" and event.error.code == "UNAVAILABLE":
                    pending.seq = 0  # the engine is gone: no result will come
                response = to_type_response(event)
                if response is not None:
                    yield response
        finally:
            if reader is not None:
                reader.cancel()
            session.detach_listener(events)
            if not taken_over:  # taken over: the session goes on with its new connection
                await self.service.release(session)

    async def _first(self, request_iterator):
        """The open message, within type_open_timeout_s (a stream that never opens is not held)."""
        timeout = self.service.settings.type_open_timeout_s
        try:
            first = await asyncio.wait_for(anext(aiter(request_iterator), None), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise ApiError("INVALID_ARGUMENT", f"no open message within {timeout:g} s") from None
        first = checked(first)
        if first is None or first.WhichOneof("kind") != "open":
            raise ApiError("INVALID_ARGUMENT", "the first message of Type must be open")
        return first

    async def _read(self, request_iterator, session, pending: "_Pending", events: asyncio.Queue) -> None:
        limiter = RateLimiter(self.service.settings.rate_per_s, self.service.settings.rate_burst)
        try:
            async for request in request_iterator:
                kind = None
                try:
                    request = checked(request)
                    kind = request.WhichOneof("kind")
                    self.service.metrics.messages.labels(EDGE, kind or "other").inc()
                    limiter.take()
                    if kind == "input":
                        await self.service.input(session, request.input.seq, request.input.text)
                    elif kind == "submit":
                        s = request.submit
                        pending.seq = s.seq  # before the write: the result may come back at once
                        await self.service.submit(session, s.seq, s.text, s.params.max_new_tokens or None,
                                                  sampling_of(s.params),
                                                  s.candidates if s.HasField("candidates") else None)
                    else:
                        raise ApiError("INVALID_ARGUMENT", f"unexpected {kind!r} after open")
                except ApiError as exc:
                    if kind == "submit":
                        pending.seq = 0
                    self.service.metrics.errors.labels(EDGE, exc.code).inc()
                    events.put_nowait(_error_event(exc))
        finally:
            events.put_nowait(_INPUT_DONE)

    async def Complete(self, request, context):  # noqa: N802
        try:
            tenant = self._tenant(context)
            request = checked(request)
            params = request.params
            async for event in self.service.complete(tenant, request.db, request.question,
                                                     params.max_new_tokens or None, request.mode or "prefix",
                                                     list(request.tables), sampling=sampling_of(params),
                                                     candidates=request.candidates
                                                     if request.HasField("candidates") else None):
                kind = event.WhichOneof("kind")
                if kind == "error":
                    raise ApiError(event.error.code, event.error.message)
                if kind in ("tokens", "result", "choice"):
                    yield headstart_pb2.CompleteResponse(**{kind: getattr(event, kind)})
        except ApiError as exc:
            await self._abort(context, exc)

    async def OpenSession(self, request, context):  # noqa: N802
        try:
            tenant = self._tenant(context)
            session = await self.service.open(tenant, checked(request).db, ephemeral=False)
        except ApiError as exc:
            await self._abort(context, exc)
        return headstart_pb2.OpenSessionResponse(session_id=session.session_id, db=session.db)

    async def CloseSession(self, request, context):  # noqa: N802
        try:
            tenant = self._tenant(context)
            await self.service.close(tenant, checked(request).session_id)
        except ApiError as exc:
            await self._abort(context, exc)
        return headstart_pb2.CloseSessionResponse()

    async def ListDatabases(self, request, context):  # noqa: N802
        try:
            self._tenant(context)
        except ApiError as exc:
            await self._abort(context, exc)
        return headstart_pb2.ListDatabasesResponse(databases=[
            headstart_pb2.Database(id=d.id, num_tables=d.num_tables, can_execute=d.can_execute)
            for d in self.service.list_databases()
        ])


async def start_grpc_server(service: GatewayService, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start the public server on the running loop; returns it and its bound port."""
    limit = service.settings.max_message_bytes
    # NOTE: the transport takes up to WIRE_CEILING so that the servicer answers
    # MESSAGE_TOO_LARGE with its trailer for anything above max_message_bytes.
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max(limit, WIRE_CEILING))])
    add_headstart_servicer(HeadstartServicer(service), server, limit)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                         reflection.SERVICE_NAME), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the gRPC server to {host}:{port}")
    await server.start()
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, bound
