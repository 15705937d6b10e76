"""What every edge (WebSocket, REST, public gRPC) calls: sessions, typing, completions.

All methods run on the gateway's one event loop. Typed failures are
`ApiError`s with a code; the edges turn them into their own error format.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import grpc

from headstart.client.errors import ApiError
from headstart.schema.catalogue import Catalogue
from headstart.v1 import engine_pb2, engine_pb2_grpc, types_pb2
from services.engine.guard import SECRET_METADATA_KEY, TENANT_METADATA_KEY, configured_secret
from services.gateway.auth import Authenticator
from services.gateway.candidates import check_limits, checked_candidates
from services.gateway.data_service import DataService
from services.gateway.databases import DatabaseInfo, RunLimits, list_catalogue, lookup, sqlite_file
from services.gateway.engine_direct import DirectChannels
from services.gateway.engine_kv import EngineKVGauges
from services.gateway.engine_link import EngineLink
from services.gateway.limits import check_seq, check_tables, check_text, new_chars
from services.gateway.metrics import GatewayMetrics
from services.gateway.loop_lag import LoopLagProbe
from services.gateway.runs import RunPool
from services.gateway.sessions import SESSION_ENDED, GatewaySession, SessionRegistry, engine_session_id
from services.gateway.settings import GatewaySettings
from services.gateway.tenancy import TenantQuotas

log = logging.getLogger(__name__)
MODES = ("prefix", "cold")
REAP_PERIOD_S = 5.0  # how often the reaper looks (the idle timeout itself is session_idle_s)
OPEN_ATTEMPTS = 12  # a full replica: a fresh session id hashes to another one (while the tenant is under its share)
# Runs in worker processes at the idle CPU priority (services/gateway/runs.py:
# on threads they shared the event loop's GIL).
RUN_WORKERS = 8


class GatewayService:
    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics | None = None):
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.engine_kv = EngineKVGauges(self.metrics.registry)
        self.auth = Authenticator(settings.tokens)
        self.quotas = TenantQuotas(settings)
        self.sessions = SessionRegistry(self.quotas.session_share)
        self.catalogue = Catalogue.from_env(settings.spider_dir, extra_roots=settings.sqlite_roots)
        secret = configured_secret(settings.engine_secret) or ""
        self._engine_md = (("application", settings.engine_app), (SECRET_METADATA_KEY, secret))
        self._channel: grpc.aio.Channel | None = None
        self._stub: engine_pb2_grpc.EngineStub | None = None
        # session streams straight to the replica Serve routes them to (services/gateway/engine_direct.py)
        self.direct = DirectChannels(settings.engine_direct, self.metrics.engine_streams)
        self._databases: list[DatabaseInfo] | None = None
        self._runs = RunPool(RUN_WORKERS)
        # How late the loop wakes a 5 ms sleeper: diagnostics (bench neighbour reads it per phase).
        self.loop_lag = LoopLagProbe()
        self._reaper: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()  # fire-and-forget calls (a task needs a reference)
        self.data = DataService(self)  # data sessions (issue 12): their state is in Redis

    async def start(self) -> None:
        """Open the channel to Serve's gRPC proxy (call on the serving loop)."""
        self._channel = grpc.aio.insecure_channel(self.settings.engine_target)
        self._stub = engine_pb2_grpc.EngineStub(self._channel)
        self._reaper = asyncio.create_task(self._reap_idle_sessions())
        self.data.start()
        self.loop_lag.start()

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        self.loop_lag.stop()
        for tenant, sid in [(s.tenant, s.session_id) for s in self.sessions.all()]:
            await self.close(tenant, sid, free_engine=False)
        if self._channel is not None:
            await self._channel.close()
        await self.direct.close()
        self._runs.shutdown()
        await self.data.stop()

    async def _reap_idle_sessions(self) -> None:
        """Close every session no client holds any more: one opened by REST/gRPC OpenSession that
        nobody used for session_idle_s, and a connection's own (ephemeral) session whose
        connection is gone without closing it (each edge closes its own on every way out;
        this is the net under a way that was missed, issue 29)."""
        period = min(REAP_PERIOD_S, max(0.05, self.settings.session_idle_s / 4))
        while True:
            await asyncio.sleep(period)
            for session in self.sessions.all():
                leaked = session.ephemeral and session.orphaned() and session.link is not None
                if leaked or (not session.ephemeral and session.idle_for() > self.settings.session_idle_s):
                    try:
                        await self.close(session.tenant, session.session_id)
                    except ApiError:
                        continue  # closed meanwhile (its edge got there first)
                    log.info("closed %s session %s of %s", "leaked" if leaked else "idle", session.session_id,
                             session.tenant)
                    self.metrics.sessions_reaped.labels("leaked" if leaked else "idle").inc()

    # -- sessions -----------------------------------------------------------

    async def open(self, tenant: str, db: str, ephemeral: bool,
                   candidates: types_pb2.CandidatesRequest | None = None) -> GatewaySession:
        """Create a session and attach it on a replica (admission happens there); its pauses
        decode `candidates` (None: the engine's default).

        Raises:
            ApiError: INVALID_ARGUMENT, NOT_FOUND (unknown db), RESOURCE_EXHAUSTED.
        """
        lookup(self.catalogue, db)
        candidates = self.candidates(candidates)
        for attempt in range(OPEN_ATTEMPTS):
            try:
                return await self._open_once(tenant, db, ephemeral, candidates)
            except ApiError as exc:
                if exc.code != "RESOURCE_EXHAUSTED" or attempt == OPEN_ATTEMPTS - 1 \
                        or self.sessions.count(tenant) >= self.quotas.session_share:
                    raise
        raise AssertionError("unreachable")

    async def _open_once(self, tenant: str, db: str, ephemeral: bool,
                         candidates: types_pb2.CandidatesRequest | None = None) -> GatewaySession:
        session = self.sessions.create(tenant, db, ephemeral)
        if ephemeral:
            session.attach_listener()  # its connection listens from the first event on
        link = EngineLink(
            self._stub, self.settings.engine_app, engine_session_id(tenant, session.session_id), db,
            self.settings.policy, session.latest, lambda ev: self._deliver(session, ev),
            self.metrics.observe_rtt, self.settings.reconnect_timeout_s,
            extra_metadata=(*self._engine_md[1:], (TENANT_METADATA_KEY, tenant)), direct=self.direct,
            candidates=candidates,
        )
        try:
            await link.start()
        except BaseException as exc:
            # NOTE: also when the caller left (CancelledError) after the replica attached:
            # the stream must not stay open holding a replica slot (close() never awaits)
            self.sessions.pop(tenant, session.session_id)
            await link.close()
            if isinstance(exc, grpc.aio.AioRpcError):
                raise ApiError("UNAVAILABLE", f"engine unreachable: {exc.details()}") from exc
            raise
        session.link = link
        self.metrics.sessions.set(self.sessions.count())
        return session

    def get(self, tenant: str, session_id: str) -> GatewaySession:
        return self.sessions.get(tenant, session_id)

    async def release(self, session: GatewaySession) -> None:
        """The edge connection of `session` ended (any way: closed, aborted, cancelled): close
        the session when it was the connection's own, else stop its answer (nobody reads it).

        Shielded: the edge's own task may be cancelled while this runs (a gRPC stream the
        client cancelled), and a close cut halfway would leave the replica's stream open."""
        if session.ephemeral:
            work = self.close(session.tenant, session.session_id)
        elif session.link is not None:
            work = session.link.cancel_generation()
        else:
            return
        try:
            await asyncio.shield(asyncio.ensure_future(work))
        except (ApiError, asyncio.CancelledError):
            pass  # closed already (NOT_FOUND), or the edge was cancelled: the shielded close goes on

    async def close(self, tenant: str, session_id: str, free_engine: bool = True) -> None:
        """Forget the session; the replica drops its cache (NOT_FOUND if unknown)."""
        session = self.sessions.pop(tenant, session_id)
        if session is None:
            raise ApiError("NOT_FOUND", f"no session {session_id!r}")
        self.metrics.sessions.set(self.sessions.count())
        session.end_taps()
        if session.link is not None:
            await session.link.close()
            self.metrics.reconnects.inc(session.link.num_reconnects)
        if free_engine:
            ref = engine_pb2.EngineSessionRef(session_id=engine_session_id(tenant, session_id))
            try:
                await self._stub.CloseSession(ref, metadata=session.link.metadata, timeout=10)
            except grpc.aio.AioRpcError:
                pass  # the replica is gone: so is the cache

    async def describe(self, session: GatewaySession) -> engine_pb2.EngineSessionInfo:
        """Ask the replica that the router picks for this session (diagnostics, tests)."""
        ref = engine_pb2.EngineSessionRef(session_id=engine_session_id(session.tenant, session.session_id))
        return await self._stub.Describe(ref, metadata=session.link.metadata, timeout=10)

    async def refresh_engine_kv(self) -> None:
        """Ask the replicas for their KV bytes (before /metrics renders them; see engine_kv)."""
        if self._stub is not None:
            await self.engine_kv.refresh(self._stub, self._engine_md)

    def engine_metadata(self) -> tuple[tuple[str, str], ...]:
        """What this gateway sends the engine on every call (application, secret)."""
        return self._engine_md

    # -- typing -------------------------------------------------------------

    async def input(self, session: GatewaySession, seq: object, text: object) -> bool:
        """A snapshot; False when `seq` is not newer (ignored, as the engine would)."""
        seq, text = check_seq(seq, session.seq), check_text(text, self.settings.max_text_chars)
        self._check_link(session)
        if not session.accept(seq):
            return False
        self.quotas.work.spend(session.tenant, new_chars(session.text, text))
        session.touch()
        session.seq, session.text = seq, text
        await session.link.send_snapshot(seq, text)
        return True

    async def submit(self, session: GatewaySession, seq: object, text: object, max_new_tokens: object = None,
                     sampling: types_pb2.SamplingParams | None = None,
                     candidates: types_pb2.CandidatesRequest | None = None) -> None:
        """Enter on a typing session: answer `text` (the engine's events go to the session's readers).
        `candidates` (None: the session's): with k > 1 a Choice follows the Result."""
        seq, text = check_seq(seq, session.seq), check_text(text, self.settings.max_text_chars)
        self._check_link(session)
        if seq < session.seq:
            raise ApiError("STALE_SEQUENCE", f"submit seq {seq} is older than snapshot {session.seq}")
        params = self.params(max_new_tokens)
        if sampling is not None:
            params.MergeFrom(sampling)  # proto3: its unset max_new_tokens (0) leaves ours
        candidates = self.candidates(candidates, params)
        self.quotas.work.spend(session.tenant, new_chars(session.text, text))
        session.touch()
        session.seq, session.text, session.submitted_seq = seq, text, seq
        await session.link.send_submit(seq, text, params, candidates, check_limits(self.settings))

    async def answer_on_session(self, tenant: str, session_id: str, question: object, max_new_tokens: object = None,
                                sampling: types_pb2.SamplingParams | None = None,
                                candidates: types_pb2.CandidatesRequest | None = None
                                ) -> AsyncIterator[engine_pb2.EngineEvent]:
        """Submit `question` on a typing session of `tenant` and yield that answer's
        events: tokens, then the result, then its choice when it decoded candidates
        (an OpenAI completion naming the session).

        The submit takes the next sequence number (a typing client's next
        snapshot with the same number is dropped as not newer: harmless, the
        one after carries the whole text). The answer comes from the session's
        cache; its events also reach the session's own connection.

        Raises:
            ApiError: NOT_FOUND (no such session of this tenant), the submit's
                refusal, the engine's error for it, SESSION_CLOSED.
        """
        session = self.get(tenant, session_id)
        tap = session.add_tap()
        try:
            seq = session.seq + 1
            await self.submit(session, seq, question, max_new_tokens, sampling, candidates)
            choice_owed = False
            while True:
                event = await tap.get()
                if event is SESSION_ENDED:
                    raise ApiError("SESSION_CLOSED", f"session {session_id!r} closed before its answer")
                kind = event.WhichOneof("kind")
                if kind == "tokens":
                    yield event
                elif kind == "result" and event.result.seq == seq:
                    yield event
                    choice_owed = event.result.num_candidates > 1
                    if not choice_owed:
                        return
                elif kind == "choice" and choice_owed and event.choice.seq == seq:
                    yield event
                    return
                elif kind == "error" and event.error.seq in (seq, 0):
                    raise ApiError(event.error.code, event.error.message, seq)
        finally:
            session.remove_tap(tap)

    def candidates(self, wire: types_pb2.CandidatesRequest | None,
                   params: types_pb2.SamplingParams | None = None) -> types_pb2.CandidatesRequest | None:
        """`wire` checked against this gateway's `max_candidates` and the answer's sampling
        `params` (INVALID_ARGUMENT when out of range or not greedy)."""
        return None if wire is None else checked_candidates(wire, self.settings.max_candidates, params)

    def params(self, max_new_tokens: object) -> types_pb2.SamplingParams:
        if max_new_tokens is None or max_new_tokens == 0:
            max_new_tokens = self.settings.default_max_new_tokens
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) \
                or not 1 <= max_new_tokens <= self.settings.max_new_tokens_limit:
            raise ApiError("INVALID_ARGUMENT", f"max_new_tokens must be 1..{self.settings.max_new_tokens_limit}")
        return types_pb2.SamplingParams(max_new_tokens=max_new_tokens)

    # -- stateless ----------------------------------------------------------

    async def complete(self, tenant: str, db: str, question: object, max_new_tokens: object = None,
                       mode: str = "prefix", tables: object = None,
                       sampling: types_pb2.SamplingParams | None = None,
                       candidates: types_pb2.CandidatesRequest | None = None
                       ) -> AsyncIterator[engine_pb2.EngineEvent]:
        """Tokens events then a Result (or one Error) from any replica; with `candidates`
        (k > 1; None: the engine's default) a Choice after the Result.

        `tables` (None or []: the whole schema) prompts with those tables of
        `db` in that order; a name the database lacks comes back as an Error
        event with INVALID_ARGUMENT from the replica. `sampling` (temperature,
        top_p, seed; greedy when absent) is checked by the replica.
        """
        question = check_text(question, self.settings.max_text_chars)
        if mode not in MODES:
            raise ApiError("INVALID_ARGUMENT", f"mode must be one of {', '.join(MODES)}")
        lookup(self.catalogue, db)
        tables = check_tables(tables)
        params = self.params(max_new_tokens)
        if sampling is not None:
            params.MergeFrom(sampling)  # proto3: its unset max_new_tokens (0) leaves ours
        candidates = self.candidates(candidates, params)
        # NOTE: the request id is also its routing key (metadata session_id), so the
        # CancelComplete sent when the client leaves reaches the replica running it
        rid = uuid.uuid4().hex
        request = engine_pb2.EngineCompleteRequest(db=db, question=question, params=params,
                                                   mode=mode, tables=tables or [], request_id=rid,
                                                   candidates=candidates, check_limits=check_limits(self.settings))
        async with self.quotas.completes.slot(tenant):
            self.quotas.work.spend(tenant, len(question))
            call = self._stub.Complete(request, metadata=(*self._engine_md, (TENANT_METADATA_KEY, tenant),
                                                          ("session_id", rid)))
            outcome = "error"
            try:
                async for event in call:
                    if event.WhichOneof("kind") == "result":
                        self.metrics.observe_result("complete", event.result)
                    elif event.WhichOneof("kind") == "choice":
                        self.metrics.observe_choice(event.choice)
                    yield event
                outcome = "done"
            except asyncio.CancelledError:
                outcome = "cancelled"  # the client left (REST disconnect, gRPC cancel)
                self._cancel_complete(rid)
                raise
            except grpc.aio.AioRpcError as exc:
                raise ApiError("UNAVAILABLE", f"engine: {exc.details()}") from exc
            finally:
                call.cancel()
                self.metrics.completions.labels(outcome).inc()

    def _cancel_complete(self, rid: str) -> None:
        """Tell the replica a Complete's client left (Serve's proxy does not pass every cancellation
        on: services/engine/completes.py). Sent on a task of its own: the caller is being cancelled."""
        async def send():
            try:
                await self._stub.CancelComplete(engine_pb2.CompleteRef(request_id=rid), timeout=10,
                                                metadata=(*self._engine_md, ("session_id", rid)))
            except grpc.aio.AioRpcError as exc:  # the replica is gone: so is the request
                log.debug("CancelComplete %s: %s", rid, exc.details())

        task = asyncio.ensure_future(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def list_databases(self) -> list[DatabaseInfo]:
        if self._databases is None:
            self._databases = list_catalogue(self.catalogue)
        return self._databases

    async def execute(self, tenant: str, db: object, sql: object) -> dict:
        """A bounded read-only Run on a catalogue database, in the tenant's Run slots."""
        sql = check_text(sql, self.settings.max_text_chars)
        path = sqlite_file(self.catalogue, lookup(self.catalogue, db))
        s = self.settings
        limits = RunLimits(s.execute_row_limit, s.execute_cell_bytes, s.execute_total_bytes, s.execute_value_bytes,
                           s.execute_timeout_s)
        async with self.quotas.executes.slot(tenant):
            return await self._runs.run(path, sql, limits)

    @staticmethod
    def _check_link(session: GatewaySession) -> None:
        if session.link is None or session.link.failed:
            raise ApiError("UNAVAILABLE", "the engine is unreachable for this session; open a new one")

    def _deliver(self, session: GatewaySession, event: engine_pb2.EngineEvent) -> None:
        if event.WhichOneof("kind") == "result":
            if event.result.ttft_ms:
                self.metrics.observe_ttft(event.result.ttft_ms)
            self.metrics.observe_result("session", event.result)
        elif event.WhichOneof("kind") == "choice":
            self.metrics.observe_choice(event.choice)
        session.deliver(event)
