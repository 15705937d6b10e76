"""The gateway's unary calls to the replicas for data sessions, and the rebuild rule.

Every call carries `session_id` metadata (the engine-level id), so Serve's
router sends all calls of a data session to the replica holding its cache,
like a typing session's stream. A replica that does not hold the session
answers NOT_FOUND "data session not on this replica" (it died, or the ring
moved): the gateway then opens the session there again with the rows the
store logged (`DataOpen(rows=...)`), and retries the call once. Rebuilds of
one session are serialized by its lock; the caller holding it passes
`locked=True`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from headstart.client.errors import CODE_METADATA_KEY, CODES, ApiError, retry_from_metadata
from headstart.engine.errors import LAST_SEQ_METADATA_KEY
from headstart.v1 import engine_pb2
from services.engine.guard import TENANT_METADATA_KEY
from services.gateway.data_wire import engine_rows

log = logging.getLogger(__name__)
NOT_HERE = "not on this replica"
CALL_TIMEOUT_S = 120.0  # a query on a busy replica; the engine bounds its own work


def not_here(exc: grpc.aio.AioRpcError) -> bool:
    """True for the replica's "I do not hold this data session" (rebuild it there)."""
    return exc.code() == grpc.StatusCode.NOT_FOUND and NOT_HERE in (exc.details() or "")


class SeqsBehindError(ApiError):
    """The replica has seen seqs up to `last_seq`, at or above this push's first (the store lost
    writes it had taken): the push is to be renumbered above `last_seq` (never sent to a client)."""

    def __init__(self, message: str, last_seq: int):
        super().__init__("SEQS_BEHIND", message)
        self.last_seq = last_seq


def engine_error(exc: grpc.aio.AioRpcError) -> ApiError:
    """A replica's failure as the API's typed error (its exact code when it sent one)."""
    trailing = exc.trailing_metadata() or ()
    code = dict(trailing).get(CODE_METADATA_KEY)
    last_seq = dict(trailing).get(LAST_SEQ_METADATA_KEY) or ""
    if code == "SEQS_BEHIND" and last_seq.isdigit():
        return SeqsBehindError(exc.details() or "", int(last_seq))
    status = exc.code()
    if code is None:
        code = status.name if status.name in CODES else "UNAVAILABLE"
        if status in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN):
            code = "UNAVAILABLE"
        elif status == grpc.StatusCode.FAILED_PRECONDITION:
            code = "SESSION_CLOSED"
    details = exc.details() or ""
    return ApiError(code, details if code != "UNAVAILABLE" else f"engine: {details}",
                    retry_after_s=retry_from_metadata(trailing))


class DataEngine:
    """Calls `Engine.Data*` for one gateway; `call` rebuilds a session the replica lacks (module docstring)."""

    def __init__(self, stub_of: Callable[[], object], app_name: str, engine_md: tuple[tuple[str, str], ...],
                 on_rebuild: Callable[[], None] = lambda: None):
        self._stub_of, self._app, self._md = stub_of, app_name, engine_md
        self._on_rebuild = on_rebuild

    def metadata(self, tenant: str, eid: str) -> tuple[tuple[str, str], ...]:
        return (("application", self._app), ("session_id", eid), *self._md[1:], (TENANT_METADATA_KEY, tenant))

    async def open(self, tenant: str, eid: str, meta: dict,
                   rows: list[tuple[int, dict]]) -> engine_pb2.DataInfo:
        """DataOpen on the replica the router picks (a new session, or a rebuild from `rows`)."""
        settings = engine_pb2.DataSettingsWire(**_settings_fields(meta))
        request = engine_pb2.DataOpenRequest(session_id=eid, db=meta["db"], tenant=tenant, settings=settings,
                                             rows=engine_rows(rows))
        return await self.call_once("DataOpen", request, tenant, eid)

    async def call(self, method: str, request, tenant: str, eid: str, meta: dict, lock: asyncio.Lock,
                   rows: Callable[[], Awaitable[list[tuple[int, dict]]]], locked: bool = False):
        """`method(request)`; a session the replica lacks is rebuilt from `rows()` and the call retried.

        Raises:
            ApiError: the replica's typed error, or UNAVAILABLE when it cannot be reached.
        """
        try:
            return await self.call_once(method, request, tenant, eid, rebuildable=True)
        except _NotHere:
            pass
        if locked:
            await self._rebuild(tenant, eid, meta, rows)
        else:
            async with lock:
                try:  # another call may have rebuilt it meanwhile
                    return await self.call_once(method, request, tenant, eid, rebuildable=True)
                except _NotHere:
                    await self._rebuild(tenant, eid, meta, rows)
        return await self.call_once(method, request, tenant, eid)

    async def _rebuild(self, tenant: str, eid: str, meta: dict, rows) -> None:
        logged = await rows()
        log.info("rebuilding data session %s from %d logged rows", eid, len(logged))
        await self.open(tenant, eid, meta, logged)
        self._on_rebuild()

    async def call_once(self, method: str, request, tenant: str, eid: str, rebuildable: bool = False):
        """`method(request)` on the session's replica, once (no rebuild); failures as ApiError."""
        stub = self._stub_of()
        if stub is None:
            raise ApiError("UNAVAILABLE", "the gateway has not connected to the engine yet")
        try:
            return await getattr(stub, method)(request, metadata=self.metadata(tenant, eid), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if rebuildable and not_here(exc):
                raise _NotHere() from None
            raise engine_error(exc) from None


class _NotHere(Exception):
    """The replica reached does not hold the session."""


def _settings_fields(meta: dict) -> dict:
    """DataSettingsWire fields from a session's meta (unset ones: the engine's defaults)."""
    out = {}
    if meta.get("retention"):
        out["retention"] = meta["retention"]
    for name in ("retention_tokens", "buffer_rows"):
        if meta.get(name):
            out[name] = int(meta[name])
    return out
