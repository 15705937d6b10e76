"""What every edge (WebSocket, REST, public gRPC) calls: sessions, typing, completions.

All methods run on the gateway's one event loop. Typed failures are
`ApiError`s with a code; the edges turn them into their own error format.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from headstart.client.errors import ApiError
from headstart.v1 import engine_pb2, engine_pb2_grpc, types_pb2
from services.gateway.auth import Authenticator
from services.gateway.databases import DatabaseInfo, list_spider_databases, run_read_only
from services.gateway.engine_link import EngineLink
from services.gateway.limits import check_seq, check_tables, check_text
from services.gateway.metrics import GatewayMetrics
from services.gateway.sessions import GatewaySession, SessionRegistry, engine_session_id
from services.gateway.settings import GatewaySettings

MODES = ("prefix", "cold")
MAX_DB_CHARS = 512


class GatewayService:
    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics | None = None):
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.auth = Authenticator(settings.tokens)
        self.sessions = SessionRegistry(settings.max_sessions_per_tenant)
        self._channel: grpc.aio.Channel | None = None
        self._stub: engine_pb2_grpc.EngineStub | None = None
        self._databases: list[DatabaseInfo] | None = None

    async def start(self) -> None:
        """Open the channel to Serve's gRPC proxy (call on the serving loop)."""
        self._channel = grpc.aio.insecure_channel(self.settings.engine_target)
        self._stub = engine_pb2_grpc.EngineStub(self._channel)

    async def stop(self) -> None:
        for tenant, sid in [(s.tenant, s.session_id) for s in list(self.sessions._sessions.values())]:
            await self.close(tenant, sid, free_engine=False)
        if self._channel is not None:
            await self._channel.close()

    # -- sessions -----------------------------------------------------------

    async def open(self, tenant: str, db: str, ephemeral: bool) -> GatewaySession:
        """Create a session and attach it on a replica (admission happens there).

        Raises:
            ApiError: INVALID_ARGUMENT, NOT_FOUND (unknown db), RESOURCE_EXHAUSTED.
        """
        if not isinstance(db, str) or not db.strip() or len(db) > MAX_DB_CHARS:
            raise ApiError("INVALID_ARGUMENT", "db must be a non-empty database id")
        session = self.sessions.create(tenant, db, ephemeral)
        link = EngineLink(
            self._stub, self.settings.engine_app, engine_session_id(tenant, session.session_id), db,
            self.settings.policy, session.latest, lambda ev: self._deliver(session, ev),
            self.metrics.observe_rtt, self.settings.reconnect_timeout_s,
        )
        try:
            await link.start()
        except grpc.aio.AioRpcError as exc:
            self.sessions.pop(tenant, session.session_id)
            raise ApiError("UNAVAILABLE", f"engine unreachable: {exc.details()}") from exc
        except BaseException:
            self.sessions.pop(tenant, session.session_id)
            raise
        session.link = link
        self.metrics.sessions.set(self.sessions.count())
        return session

    def get(self, tenant: str, session_id: str) -> GatewaySession:
        return self.sessions.get(tenant, session_id)

    async def close(self, tenant: str, session_id: str, free_engine: bool = True) -> None:
        """Forget the session; the replica drops its cache (NOT_FOUND if unknown)."""
        session = self.sessions.pop(tenant, session_id)
        if session is None:
            raise ApiError("NOT_FOUND", f"no session {session_id!r}")
        self.metrics.sessions.set(self.sessions.count())
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

    # -- typing -------------------------------------------------------------

    async def input(self, session: GatewaySession, seq: object, text: object) -> bool:
        """A snapshot; False when `seq` is not newer (ignored, as the engine would)."""
        seq, text = check_seq(seq), check_text(text, self.settings.max_text_chars)
        self._check_link(session)
        if not session.accept(seq):
            return False
        session.seq, session.text = seq, text
        await session.link.send_snapshot(seq, text)
        return True

    async def submit(self, session: GatewaySession, seq: object, text: object, max_new_tokens: object = None) -> None:
        seq, text = check_seq(seq), check_text(text, self.settings.max_text_chars)
        self._check_link(session)
        if seq < session.seq:
            raise ApiError("STALE_SEQUENCE", f"submit seq {seq} is older than snapshot {session.seq}")
        params = self.params(max_new_tokens)
        session.seq, session.text, session.submitted_seq = seq, text, seq
        await session.link.send_submit(seq, text, params)

    def params(self, max_new_tokens: object) -> types_pb2.SamplingParams:
        if max_new_tokens is None or max_new_tokens == 0:
            max_new_tokens = self.settings.default_max_new_tokens
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) \
                or not 1 <= max_new_tokens <= self.settings.max_new_tokens_limit:
            raise ApiError("INVALID_ARGUMENT", f"max_new_tokens must be 1..{self.settings.max_new_tokens_limit}")
        return types_pb2.SamplingParams(max_new_tokens=max_new_tokens)

    # -- stateless ----------------------------------------------------------

    async def complete(self, db: str, question: object, max_new_tokens: object = None,
                       mode: str = "prefix", tables: object = None,
                       sampling: types_pb2.SamplingParams | None = None) -> AsyncIterator[engine_pb2.EngineEvent]:
        """Tokens events then a Result (or one Error) from any replica.

        `tables` (None or []: the whole schema) prompts with those tables of
        `db` in that order; a name the database lacks comes back as an Error
        event with INVALID_ARGUMENT from the replica. `sampling` (temperature,
        top_p, seed; greedy when absent) is checked by the replica.
        """
        question = check_text(question, self.settings.max_text_chars)
        if mode not in MODES:
            raise ApiError("INVALID_ARGUMENT", f"mode must be one of {', '.join(MODES)}")
        if not isinstance(db, str) or not db.strip() or len(db) > MAX_DB_CHARS:
            raise ApiError("INVALID_ARGUMENT", "db must be a non-empty database id")
        tables = check_tables(tables)
        params = self.params(max_new_tokens)
        if sampling is not None:
            params.MergeFrom(sampling)  # proto3: its unset max_new_tokens (0) leaves ours
        request = engine_pb2.EngineCompleteRequest(db=db, question=question, params=params,
                                                   mode=mode, tables=tables or [])
        call = self._stub.Complete(request, metadata=(("application", self.settings.engine_app),))
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as exc:
            raise ApiError("UNAVAILABLE", f"engine: {exc.details()}") from exc
        finally:
            call.cancel()

    def list_databases(self) -> list[DatabaseInfo]:
        if self._databases is None:
            self._databases = list_spider_databases(self.settings.spider_dir)
        return self._databases

    async def execute(self, db: str, sql: object) -> dict:
        sql = check_text(sql, self.settings.max_text_chars)
        return await asyncio.to_thread(run_read_only, db, sql, self.settings.execute_row_limit,
                                       self.settings.execute_timeout_s, self.settings.spider_dir)

    @staticmethod
    def _check_link(session: GatewaySession) -> None:
        if session.link is None or session.link.failed:
            raise ApiError("UNAVAILABLE", "the engine is unreachable for this session; open a new one")

    def _deliver(self, session: GatewaySession, event: engine_pb2.EngineEvent) -> None:
        if event.WhichOneof("kind") == "result" and event.result.ttft_ms:
            self.metrics.ttft.observe(event.result.ttft_ms)
        session.deliver(event)
