"""What the data API's edges (REST, SSE, WebSocket, gRPC) call: data sessions.

The gateway owns a data session's rows: a push is validated against the
database's schema here (a bad row fails the whole push with
INVALID_ARGUMENT naming it; nothing else is dropped), numbered and written to
the rows log in Redis in one step (`LiveStore.log_push`) *before* it is
forwarded, so a replica that loses the session rebuilds it from the log
(services/gateway/data_engine.py). The store's Redis fsyncs before it
replies, so an ack means the rows are on disk; a client's optional push id
makes a retried push answer with the earlier ack instead of adding rows. A
session's meta (tenant, db, retention) lives in Redis too: any gateway can
serve it. Store keys are the
engine-level ids (`engine_session_id(tenant, id)`), so another tenant's id
names nothing: NOT_FOUND. A tenant's open sessions are counted in the set
`{prefix}:data:tenant:{tenant}:sessions` (its share: `data_sessions_per_tenant`).

A query whose question is registered as a flash question and whose stored
answer is at the session's current data version is answered from Redis
without the model (`source: "flash"`); an answer at an older version is
never served as current.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
import weakref

from headstart.client.errors import ApiError, code_of
from headstart.engine.errors import HeadstartError, InvalidInput
from headstart.schema.model import Schema, SchemaError
from headstart.v1 import engine_pb2
from services.gateway.data_engine import DataEngine, SeqsBehindError
from services.gateway.data_wire import ack_json, describe_json, engine_rows, flash_answer, model_answer, row_dict
from services.gateway.databases import lookup
from services.gateway.limits import check_text
from services.gateway.sessions import engine_session_id
from services.gateway.tenancy import TenantSlots

log = logging.getLogger(__name__)
REDIS_URL_ENV = "HEADSTART_REDIS_URL"
RETENTIONS = ("", "shift", "rebuild")
STORE_CLIENT_NAME = "hs-gateway"  # the pool every data call uses (subscribers have their own: data_events)
MAX_RETENTION_TOKENS = 1 << 20
MAX_BUFFER_ROWS = 1 << 16
RENUMBER_TRIES = 3  # a push renumbered above its replica's seq and sent again (see DataService._forward)


class DataService:
    """Data sessions for one gateway; `start()` connects the store (no Redis: UNAVAILABLE)."""

    def __init__(self, gateway):
        self.gw = gateway
        s = gateway.settings
        self.store = None
        self.engine = DataEngine(lambda: gateway._stub, s.engine_app, gateway.engine_metadata(),
                                 on_rebuild=gateway.metrics.data_rebuilds.inc)
        self.queries = TenantSlots("data queries", s.data_queries_per_tenant, s.data_queries_per_tenant)
        self._schemas: dict[str, Schema] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.events = None  # EventStreams: subscribers' reads (services/gateway/data_events.py)

    def start(self) -> None:
        url = self.gw.settings.redis_url or os.environ.get(REDIS_URL_ENV, "")
        if url:
            from headstart.data.live_store import LiveStore  # imports redis: only when configured
            from services.gateway.data_events import EventStreams

            self.store = LiveStore(url, client_name=STORE_CLIENT_NAME)
            self.events = EventStreams(url, self.store.key, self.gw.quotas.connections.share)

    async def stop(self) -> None:
        if self.events is not None:
            await self.events.close()
        if self.store is not None:
            self.store.close()

    # -- helpers ------------------------------------------------------------

    async def _io(self, fn, *args):
        """A store call off the event loop (redis-py is blocking); its failures as typed errors."""
        if self.store is None:
            raise ApiError("UNAVAILABLE", f"the data API needs Redis: set ${REDIS_URL_ENV} "
                                          "(headstart serve starts one)")
        try:
            return await asyncio.to_thread(fn, *args)
        except HeadstartError as exc:  # LiveStoreUnavailable, FlashLimitExceeded, ...
            raise ApiError(code_of(exc), str(exc)) from None
        except ValueError as exc:  # an empty flash question
            raise ApiError("INVALID_ARGUMENT", str(exc)) from None

    async def _session(self, tenant: str, sid: object, usable: bool = True) -> tuple[str, dict]:
        """(engine id, meta) of the tenant's session `sid`; NOT_FOUND for unknown and other tenants' ids.

        With `usable`, a session whose ingestion failed is SESSION_FAILED with the replica's reason
        (describe, close, listing and the events still work: they report it).
        """
        if not isinstance(sid, str) or not sid:
            raise ApiError("INVALID_ARGUMENT", "session_id must be a non-empty string")
        eid = engine_session_id(tenant, sid)
        meta, failure = await self._io(self.store.meta_and_failure, eid)
        if meta is None or meta.get("tenant") != tenant:
            raise ApiError("NOT_FOUND", f"no data session {sid!r}")
        if usable and failure is not None:
            raise ApiError("SESSION_FAILED", f"data session {sid!r} failed: {failure} (close it and open another)")
        return eid, meta

    def _lock(self, eid: str) -> asyncio.Lock:
        lock = self._locks.get(eid)
        if lock is None:
            lock = self._locks[eid] = asyncio.Lock()
        return lock

    def schema(self, db: str) -> Schema:
        """The schema rows of `db` are validated against (SQLite databases only, as on the replica)."""
        if db not in self._schemas:
            from headstart.schema.resolve import resolve_database

            entry = lookup(self.gw.catalogue, db)
            try:
                resolved = resolve_database(entry.spec, spider_dir=self.gw.catalogue.spider_dir)
            except SchemaError as exc:
                raise ApiError("NOT_FOUND", str(exc)) from None
            if resolved.sqlite_path is None:
                raise ApiError("INVALID_ARGUMENT", f"data sessions need a SQLite database; {db!r} has no file")
            self._schemas[db] = resolved.schema
        return self._schemas[db]

    def _call(self, method, request, tenant, eid, meta, locked=False, before_seq=None):
        rows = functools.partial(self._logged_rows, eid, before_seq)
        return self.engine.call(method, request, tenant, eid, meta, self._lock(eid), rows, locked=locked)

    async def _logged_rows(self, eid: str, before_seq: int | None) -> list[tuple[int, dict]]:
        rows = await self._io(self.store.rows, eid)
        return [(seq, row) for seq, row in rows if before_seq is None or seq < before_seq]

    # -- sessions -----------------------------------------------------------

    async def open(self, tenant: str, db: object, retention: object = None, retention_tokens: object = None,
                   buffer_rows: object = None) -> dict:
        """A new data session on a replica; returns {session_id, db, data_version}.

        `retention` ("rebuild" | "shift"), `retention_tokens` and `buffer_rows`
        (unprocessed rows kept before the oldest are dropped): None or 0 keeps
        the engine's default.
        """
        if not isinstance(db, str) or not db:
            raise ApiError("INVALID_ARGUMENT", "db must be a database name")
        retention = retention or ""
        if retention not in RETENTIONS:
            raise ApiError("INVALID_ARGUMENT", f"retention must be one of {', '.join(RETENTIONS[1:])}")
        retention_tokens = _count("retention_tokens", retention_tokens, MAX_RETENTION_TOKENS)
        buffer_rows = _count("buffer_rows", buffer_rows, MAX_BUFFER_ROWS)
        self.schema(db)
        sid = uuid.uuid4().hex
        eid = engine_session_id(tenant, sid)
        meta = {"tenant": tenant, "session_id": sid, "db": db, "retention": retention,
                "retention_tokens": retention_tokens, "buffer_rows": buffer_rows, "created_at": time.time()}
        await self._io(self._admit, tenant, eid)
        try:
            await self._io(self.store.put_meta, eid, meta)
            info = await self.engine.open(tenant, eid, meta, [])
        except BaseException:
            try:
                await self._io(self.store.delete_session, eid)
                await self._io(self._release, tenant, eid)
            except ApiError as exc:  # Redis is gone too: the open's own error is the one to report
                log.warning("data session %s not cleaned up after a failed open: %s", eid, exc)
            raise
        self.gw.metrics.data_sessions_opened.inc()
        return {"session_id": sid, "db": db, "data_version": info.version}

    async def describe(self, tenant: str, sid: object) -> dict:
        eid, meta = await self._session(tenant, sid, usable=False)
        info = await self._call("DataDescribe", engine_pb2.DataRef(session_id=eid), tenant, eid, meta)
        return describe_json(meta, sid, info)

    async def close(self, tenant: str, sid: object) -> dict:
        """Forget the session: its replica cache, rows log, meta, flash questions and events."""
        eid, meta = await self._session(tenant, sid, usable=False)
        try:
            await self.engine.call_once("DataClose", engine_pb2.DataRef(session_id=eid), tenant, eid)
        except ApiError as exc:
            if exc.code not in ("NOT_FOUND", "UNAVAILABLE"):  # not held / replica gone: nothing to free
                raise
        await self._io(self.store.delete_session, eid)
        await self._io(self._release, tenant, eid)
        return {"closed": sid}

    def _admit(self, tenant: str, eid: str) -> None:
        """Count `eid` among the tenant's sessions, or RESOURCE_EXHAUSTED past `data_sessions_per_tenant`
        (shared by every gateway on this Redis)."""
        share = self.gw.settings.data_sessions_per_tenant
        if not self.store.admit_session(tenant, eid, share):
            raise ApiError("RESOURCE_EXHAUSTED", f"this tenant has {share} data sessions open (its share)")

    def _release(self, tenant: str, eid: str) -> None:
        self.store.release_session(tenant, eid)

    # -- rows ---------------------------------------------------------------

    def validate(self, db: str, rows: object) -> list[dict]:
        """Rows as canonical dicts, or ApiError(INVALID_ARGUMENT) naming the first bad one."""
        from headstart.data.rows import validate_row

        s = self.gw.settings
        if not isinstance(rows, list) or not rows:
            raise ApiError("INVALID_ARGUMENT", "rows must be a non-empty list of {table, values}")
        if len(rows) > s.data_rows_per_push:
            raise ApiError("INVALID_ARGUMENT", f"{len(rows)} rows in one push; the limit is {s.data_rows_per_push}")
        schema, out = self.schema(db), []
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ApiError("INVALID_ARGUMENT", f"row {i}: a row is an object {{table, values}}")
            try:
                out.append(row_dict(validate_row(schema, row.get("table"), row.get("values"), s.data_row_chars)))
            except InvalidInput as exc:
                raise ApiError("INVALID_ARGUMENT", f"row {i}: {exc}") from None
        return out

    async def push(self, tenant: str, sid: object, rows: object, push_id: object = None) -> dict:
        """Validate, number and log (one step), then forward; returns the replica's ack (seqs, drops, buffered).

        With `push_id`, a push id the session logged before is answered with that push's ack
        (`replayed: true`) and nothing is added: a client retries a push that timed out or got
        UNAVAILABLE without doubling its rows. Without one, a retry is a new push (at least once).
        """
        from headstart.data.live_rows import check_push_id  # imports redis: only with a store

        eid, meta = await self._session(tenant, sid)
        try:
            push_id = check_push_id(push_id)
        except InvalidInput as exc:
            raise ApiError("INVALID_ARGUMENT", str(exc)) from None
        valid = self.validate(meta["db"], rows)
        self.gw.quotas.data_work.spend(tenant, sum(len(str(r["values"])) for r in valid))
        # NOTE: one push at a time per session: the replica needs seqs in increasing order.
        async with self._lock(eid):
            # numbered and logged in one step, before the ack: the rebuild source
            logged = await self._io(self.store.log_push, eid, valid, push_id)
            if logged.replayed:
                return {**(logged.ack or ack_json(None, logged.seqs)), "replayed": True}
            reply, seqs = await self._forward(tenant, eid, meta, valid, logged.seqs, push_id)
            ack = ack_json(reply, seqs)
            if push_id is not None:
                try:
                    await self._io(self.store.record_ack, eid, push_id, ack)
                except ApiError as exc:  # the rows are logged: a retry is answered with their seqs
                    log.warning("the ack of push %r of %s not recorded: %s", push_id, eid, exc)
        m = self.gw.metrics
        m.data_rows_pushed.inc(len(valid))
        if reply.dropped:
            m.data_rows_dropped.inc(reply.dropped)
            await self._io(self.store.add_event, eid, "rows_dropped",
                           {"dropped": reply.dropped, "dropped_seqs": list(reply.dropped_seqs),
                            "dropped_total": reply.dropped_total})
        return {**ack, "replayed": False}

    async def _forward(self, tenant: str, eid: str, meta: dict, valid: list[dict], seqs: list[int],
                       push_id: str | None) -> tuple[engine_pb2.DataPushReply, list[int]]:
        """DataPush the logged rows; (the replica's reply, the rows' final seqs).

        A replica that has seen seqs the store no longer has (a Redis restarted without the tail
        of its file) answers SEQS_BEHIND with its newest: the push is renumbered above it (the
        store's counter lifted in the same step) and sent again, so the client never sees seqs
        it did not send. A push that fails as a whole is taken out of the log again, so a rebuild
        never ingests rows the client was told failed (and a retry does not add them twice).
        """
        try:
            for _ in range(RENUMBER_TRIES):
                request = engine_pb2.DataPushRequest(session_id=eid, rows=engine_rows(list(zip(seqs, valid))))
                try:
                    reply = await self._call("DataPush", request, tenant, eid, meta, locked=True, before_seq=seqs[0])
                    return reply, seqs
                except SeqsBehindError as exc:
                    log.warning("data session %s: the replica has seen seq %d, the store numbered this push "
                                "from %d (it lost writes): renumbered", eid, exc.last_seq, seqs[0])
                    renumber = functools.partial(self.store.log_push, floor=exc.last_seq,
                                                 replacing=(seqs[0], seqs[-1]))
                    renumbered = await self._io(renumber, eid, valid, push_id)
                    seqs = renumbered.seqs
            raise ApiError("UNAVAILABLE", f"push to data session {meta['session_id']!r} kept being numbered "
                                          "behind its replica (another gateway pushing at once?): retry")
        except ApiError:
            try:
                await asyncio.to_thread(self.store.unlog_push, eid, seqs, push_id)
            except Exception:  # Redis is gone too: the push's own error is the one to report
                log.exception("rows %d..%d of %s not taken out of the log", seqs[0], seqs[-1], eid)
            raise

    # -- queries ------------------------------------------------------------

    async def query(self, tenant: str, sid: object, question: object, max_new_tokens: object = None,
                    execute: object = True) -> dict:
        """A flash answer at the current version when there is one, else the replica's answer."""
        eid, meta = await self._session(tenant, sid)
        question = _question(question, self.gw.settings.max_text_chars)
        if not isinstance(execute, bool):
            raise ApiError("INVALID_ARGUMENT", "execute must be true or false")
        params = self.gw.params(max_new_tokens)
        async with self.queries.slot(tenant):
            stored = await self._io(self.store.lookup_current, eid, question)
            if stored is not None:
                self.gw.metrics.data_queries.labels("flash").inc()
                return flash_answer(stored)
            self.gw.quotas.work.spend(tenant, len(question))
            request = engine_pb2.DataQueryRequest(session_id=eid, question=question,
                                                  max_new_tokens=params.max_new_tokens, execute=execute)
            answer = await self._call("DataQuery", request, tenant, eid, meta)
            self.gw.metrics.data_queries.labels("model").inc()
            return model_answer(answer)

    # -- flash questions ----------------------------------------------------

    async def register_flash(self, tenant: str, sid: object, question: object) -> dict:
        eid, _ = await self._session(tenant, sid)
        question = _question(question, self.gw.settings.max_text_chars)
        qid = await self._io(self.store.register_flash, eid, question)  # past the bound: RESOURCE_EXHAUSTED
        return {"id": qid, "question": question}

    async def list_flash(self, tenant: str, sid: object) -> list[dict]:
        """[{id, question, answer?}]: each registered question with its latest stored answer."""
        eid, _ = await self._session(tenant, sid, usable=False)
        return [{k: v for k, v in item.items() if v is not None} for item in await self._io(self.store.list_flash, eid)]

    async def delete_flash(self, tenant: str, sid: object, qid: object) -> dict:
        eid, _ = await self._session(tenant, sid, usable=False)
        if not isinstance(qid, str) or not qid:
            raise ApiError("INVALID_ARGUMENT", "a flash question id is a non-empty string")
        if not await self._io(self.store.delete_flash, eid, qid):
            raise ApiError("NOT_FOUND", f"no flash question {qid!r}")
        return {"deleted": qid}

    # -- events -------------------------------------------------------------

    async def subscribe(self, tenant: str, sid: object, last_id: object = None, block_ms: int = 1000):
        """The session's events after `last_id` (empty: from now on) as an async iterator of
        (id, kind, payload), with None after each quiet read, until the session is closed.

        Checked (NOT_FOUND; INVALID_ARGUMENT, OUT_OF_RANGE for a resume id outside what the
        stream kept) and "now" fixed before it returns, so an edge answers errors with a
        status and a subscriber misses nothing pushed after its subscription was answered.
        The iterator raises ApiError(UNAVAILABLE) when Redis goes away. Reads are async, on
        the tenant's own pool (services/gateway/data_events.py).
        """
        eid, _ = await self._session(tenant, sid, usable=False)
        if last_id is not None and not isinstance(last_id, str):
            raise ApiError("INVALID_ARGUMENT", "last_event_id must be a string")
        after = await self.events.start(tenant, eid, last_id)
        return self.events.stream(tenant, eid, after, block_ms)


def _count(name: str, value: object, limit: int) -> int:
    """An optional positive count (None or 0: the engine's default)."""
    value = value or 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise ApiError("INVALID_ARGUMENT", f"{name} must be an integer 1..{limit}")
    return value


def _question(question: object, limit: int) -> str:
    """A checked question in its normalized spelling (live_store.normalize_question): the text a flash
    question is matched by is also the text the model answers, so both give the same answer."""
    from headstart.data.live_store import normalize_question

    question = normalize_question(check_text(question, limit))
    if not question:
        raise ApiError("INVALID_ARGUMENT", "question must not be empty")
    return question
