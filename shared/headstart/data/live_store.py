"""The live state of data sessions in Redis: rows log, versions, events, flash questions and answers.

Shared by the gateway (rows, meta, flash registry, events for SSE), the engine
replicas (they publish each data version) and the flash worker (it consumes the
versions and stores answers). Layout, with `P` the prefix and `S` the
engine-level session id (tenant-scoped, `services/gateway/sessions.py`):

    P:data:S:seq         string  last row sequence number handed out
    P:data:S:rows        zset    JSON [seq, row] scored by seq: the rebuild source, newest `max_rows`
    P:data:S:pushes      hash    push id -> the push's seqs and ack (a retry's answer)
    P:data:S:push_ids    zset    push id scored by when it was logged (the oldest leave first)
    P:data:S:meta        string  JSON dict (db, tenant, settings: the gateway's)
    P:data:S:failed      string  why the session failed (set once by its replica; every call but
                                 describe and close is then SESSION_FAILED)
    P:data:S:version     string  current data version (only ever moves forward)
    P:data:S:events      stream  kind, payload (JSON); MAXLEN ~ `max_events`: SSE / Subscribe
    P:data:S:flash       hash    qid -> question (normalized), at most `max_flash`
    P:data:S:flash_norm  hash    question -> qid (one qid per question)
    P:data:S:flash_seq   string  last qid number
    P:data:S:answers     hash    qid -> JSON answer {question, version, sql, ..., computed_at}
    P:data:S:answer_ver  hash    qid -> version of the stored answer
    P:data:versions      stream  sid, tenant, version, rows_added, dropped_total; group `flash`
    P:data:tenant:T:sessions  set  the open sessions of tenant T (its share, counted across gateways)

Every check-then-write (a version moving forward, the flash bound, an answer
never replaced by an older one) is one Lua script (`live_scripts`), so
concurrent writers cannot interleave between the check and the write; so is a
push's numbering and logging (`live_rows.RowsLog`, the rows-log half of the store). The
versions stream's consumer side is `live_versions.VersionsConsumer`.

Redis failures are raised as `LiveStoreUnavailable` (connection, timeout),
`StoreFull` (Redis at its maxmemory: it evicts nothing) or `LiveStoreError`,
all `HeadstartError`s the edges map to a status.
"""

from __future__ import annotations

import json
import re
import time
from typing import NamedTuple

import redis

from headstart.data import live_scripts as scripts
from headstart.data.live_errors import (  # noqa: F401 (re-exported: the store's errors)
    FlashLimitExceeded,
    LiveStoreError,
    LiveStoreUnavailable,
    StoreFull,
    as_str,
    guarded,
)
from headstart.data.live_rows import LoggedPush, RowsLog  # noqa: F401 (re-exported)
from headstart.data.live_versions import VERSIONS_GROUP, VersionEntry, VersionsConsumer  # noqa: F401
from headstart.engine.errors import InvalidInput

_EVENT_ID = re.compile(r"\d{1,20}(-\d{1,20})?")
EVENT_KINDS = ("data_updated", "flash_ready", "rows_dropped", "session_failed")
_SESSION_KEYS = ("seq", "rows", "pushes", "push_ids", "meta", "failed", "version", "events", "flash", "flash_norm", "flash_seq",
                 "answers", "answer_ver")


class LiveEvent(NamedTuple):
    """One event of a session's stream: its Redis stream id (the SSE `id:`), kind and payload."""

    id: str
    kind: str
    payload: dict


def normalize_question(question: str) -> str:
    """The text a question is registered and matched by: stripped, whitespace runs as one space.

    NOTE: case and punctuation are kept: they change the model's tokens, and a
    flash answer must equal what the model gives for the question asked. The
    gateway sends the normalized text to the model too, so both agree exactly.
    """
    return re.sub(r"\s+", " ", question).strip()


class LiveStore(RowsLog, VersionsConsumer):
    """Data sessions' live state in one Redis (layout: module docstring).

    Args:
        redis_url_or_client: `redis://host:port/db` or a `redis.Redis`.
        prefix: namespace of every key ("hs").
        max_rows: rows kept per session in the rows log (the oldest leave first).
        max_events: approximate bound of a session's event stream (MAXLEN ~).
        max_flash: registered questions per session.
        max_version_events: approximate bound of the global versions stream.
        max_connections / socket_timeout_s: the pool built from a URL. A
            blocking read holds a connection for its `block_ms`, which is kept
            below `socket_timeout_s`.
        client_name: the name its connections give Redis (CLIENT LIST shows who holds what).
    """

    def __init__(
        self,
        redis_url_or_client: str | redis.Redis,
        prefix: str = "hs",
        *,
        max_rows: int = 50_000,
        max_events: int = 1_000,
        max_flash: int = 32,
        max_version_events: int = 100_000,
        max_connections: int = 64,
        socket_timeout_s: float = 30.0,
        client_name: str | None = None,
    ) -> None:
        for name, value in (("max_rows", max_rows), ("max_events", max_events), ("max_flash", max_flash),
                            ("max_version_events", max_version_events)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if isinstance(redis_url_or_client, str):
            pool = redis.BlockingConnectionPool.from_url(
                redis_url_or_client, max_connections=max_connections, timeout=socket_timeout_s,
                socket_timeout=socket_timeout_s, socket_connect_timeout=2.0, client_name=client_name)
            self.client = redis.Redis(connection_pool=pool)
            self._owns_client = True
        else:
            self.client = redis_url_or_client
            self._owns_client = False
        self.prefix = prefix
        self.max_rows = max_rows
        self.max_events = max_events
        self.max_flash = max_flash
        self.max_version_events = max_version_events
        self._max_block_ms = max(0, int(socket_timeout_s * 1000) - 1000)
        self.versions_key = f"{prefix}:data:versions"
        self._publish_version = self.client.register_script(scripts.PUBLISH_VERSION)
        self._register_flash = self.client.register_script(scripts.REGISTER_FLASH)
        self._delete_flash = self.client.register_script(scripts.DELETE_FLASH)
        self._store_answer = self.client.register_script(scripts.STORE_ANSWER)
        self._rows_scripts()
        self._group_ready = False

    def key(self, sid: str, name: str) -> str:
        """The Redis key of one part of a session's state (`name` from the module docstring)."""
        return f"{self.prefix}:data:{sid}:{name}"

    def close(self) -> None:
        """Close the connection pool built from a URL (a client passed in stays open)."""
        if self._owns_client:
            self.client.close()

    @guarded
    def ping(self) -> bool:
        return bool(self.client.ping())

    # ---- session meta ---------------------------------------------------------------

    @guarded
    def put_meta(self, sid: str, meta: dict) -> None:
        self.client.set(self.key(sid, "meta"), json.dumps(meta, sort_keys=True))

    @guarded
    def meta(self, sid: str) -> dict | None:
        raw = self.client.get(self.key(sid, "meta"))
        return None if raw is None else json.loads(raw)

    @guarded
    def meta_and_failure(self, sid: str) -> tuple[dict | None, str | None]:
        """The session's meta and why it failed (None: it did not), in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.key(sid, "meta"))
        pipe.get(self.key(sid, "failed"))
        raw, failed = pipe.execute()
        return (None if raw is None else json.loads(raw)), (None if failed is None else as_str(failed))

    @guarded
    def mark_failed(self, sid: str, reason: str) -> str:
        """The session failed (its replica says so, once): the `failed` key and a `session_failed`
        event in one step; returns the event's id."""
        payload = json.dumps({"code": "SESSION_FAILED", "reason": reason})
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.key(sid, "failed"), reason)
        pipe.xadd(self.key(sid, "events"), {"kind": "session_failed", "payload": payload},
                  maxlen=self.max_events, approximate=True)
        return as_str(pipe.execute()[1])

    @guarded
    def delete_session(self, sid: str) -> None:
        """Remove all of a session's keys (its entries in the versions stream stay: the
        worker finds no question for them and acks them)."""
        self.client.delete(*(self.key(sid, name) for name in _SESSION_KEYS))

    # ---- tenants' shares -------------------------------------------------------------

    def _tenant_key(self, tenant: str) -> str:
        return f"{self.prefix}:data:tenant:{tenant}:sessions"

    @guarded
    def admit_session(self, tenant: str, sid: str, share: int) -> bool:
        """Count `sid` among the tenant's open sessions; False (and not counted) past `share`."""
        key = self._tenant_key(tenant)
        pipe = self.client.pipeline(transaction=True)
        pipe.sadd(key, sid)
        pipe.scard(key)
        if pipe.execute()[1] > share:
            self.client.srem(key, sid)
            return False
        return True

    @guarded
    def release_session(self, tenant: str, sid: str) -> None:
        self.client.srem(self._tenant_key(tenant), sid)

    # ---- versions -------------------------------------------------------------------

    @guarded
    def publish_version(self, sid: str, tenant: str, version: int, rows_added: int, dropped_total: int,
                        lag_versions: int = 0, lag_seconds: float = 0.0) -> str | None:
        """A new data version of a session: sets `current_version`, adds an entry to the
        versions stream (the flash worker's) and a `data_updated` event, atomically.
        `lag_versions` / `lag_seconds`: acknowledged pushes still behind this version and the
        oldest one's age (`headstart.data.lag`), in the event and the entry (a flash worker
        leaves a version with pushes behind it to the newer one on its way).

        Returns the event id, or None when `version` is not newer than the current one
        (a replica rebuilt from the same rows publishes nothing twice).
        """
        payload = json.dumps({"version": int(version), "rows_added": int(rows_added),
                              "dropped_total": int(dropped_total), "lag_versions": int(lag_versions),
                              "lag_seconds": round(float(lag_seconds), 4)})
        event_id = self._publish_version(
            keys=[self.key(sid, "version"), self.versions_key, self.key(sid, "events")],
            args=[int(version), sid, tenant, int(rows_added), int(dropped_total), self.max_version_events,
                  self.max_events, payload, int(lag_versions)])
        return None if event_id is None else as_str(event_id)

    @guarded
    def current_version(self, sid: str) -> int:
        """The session's newest published data version (0: none)."""
        raw = self.client.get(self.key(sid, "version"))
        return 0 if raw is None else int(raw)

    # ---- events ---------------------------------------------------------------------

    @guarded
    def add_event(self, sid: str, kind: str, payload: dict) -> str:
        """Append an event to the session's stream (trimmed to about `max_events`); its id."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; valid: {list(EVENT_KINDS)}")
        return as_str(self.client.xadd(self.key(sid, "events"), {"kind": kind, "payload": json.dumps(payload)},
                                     maxlen=self.max_events, approximate=True))

    @guarded
    def events_after(self, sid: str, last_id: str | None, block_ms: int = 0, count: int = 100) -> list[LiveEvent]:
        """Events after `last_id` (an SSE `Last-Event-ID`), oldest first, at most `count`.

        `last_id` None or "0" reads from the oldest kept event; use `latest_event_id`
        to start at "now" without a gap. `block_ms` > 0 waits that long for one
        (capped below the socket timeout); 0 returns at once.

        Raises:
            InvalidInput: `last_id` is not a stream id.
        """
        start = last_id or "0-0"
        if not _EVENT_ID.fullmatch(start):  # a client's Last-Event-ID: refuse garbage before Redis does
            raise InvalidInput(f"not an event id: {start[:40]!r} (ids look like 1732441000000-0)")
        block = min(block_ms, self._max_block_ms) if block_ms > 0 else None
        reply = self.client.xread({self.key(sid, "events"): start}, count=count, block=block)
        out = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                fields = {as_str(k): as_str(v) for k, v in fields.items()}
                out.append(LiveEvent(as_str(entry_id), fields["kind"], json.loads(fields["payload"])))
        return out

    @guarded
    def latest_event_id(self, sid: str) -> str:
        """Id of the session's newest event ("0-0": none), to subscribe from now on."""
        newest = self.client.xrevrange(self.key(sid, "events"), count=1)
        return as_str(newest[0][0]) if newest else "0-0"

    # ---- flash registry -------------------------------------------------------------

    @guarded
    def register_flash(self, sid: str, question: str) -> str:
        """Register a question (normalized) and return its id; the same question again
        returns the same id.

        Raises:
            FlashLimitExceeded: the session has `max_flash` questions already.
            ValueError: an empty question.
        """
        text = normalize_question(question)
        if not text:
            raise ValueError("a flash question must not be empty")
        status, qid = self._register_flash(
            keys=[self.key(sid, "flash"), self.key(sid, "flash_norm"), self.key(sid, "flash_seq")],
            args=[text, self.max_flash])
        if int(status) < 0:
            raise FlashLimitExceeded(f"data session has {self.max_flash} flash questions already (the limit)")
        return as_str(qid)

    @guarded
    def flash_questions(self, sid: str) -> dict[str, str]:
        """qid -> question, in registration order."""
        items = {as_str(k): as_str(v) for k, v in self.client.hgetall(self.key(sid, "flash")).items()}
        return dict(sorted(items.items(), key=lambda kv: int(kv[0][1:])))

    @guarded
    def list_flash(self, sid: str) -> list[dict]:
        """`[{"id", "question", "answer"}]` in registration order (`answer` None until one is stored)."""
        questions = self.flash_questions(sid)
        answers = self._answers(sid, list(questions))
        return [{"id": qid, "question": q, "answer": answers.get(qid)} for qid, q in questions.items()]

    @guarded
    def delete_flash(self, sid: str, qid: str) -> bool:
        """Forget a question and its answer; False when it was not registered."""
        return bool(self._delete_flash(
            keys=[self.key(sid, "flash"), self.key(sid, "flash_norm"), self.key(sid, "answers"),
                  self.key(sid, "answer_ver")], args=[qid]))

    # ---- flash answers --------------------------------------------------------------

    @guarded
    def store_answer(self, sid: str, qid: str, answer: dict, *, publish: bool = False) -> bool:
        """Store `answer` (its "version" an int) if it is newer than the stored one and the
        question is still registered; idempotent, never goes back a version.

        `computed_at` (unix seconds) and `id` are added. With `publish`, a `flash_ready`
        event carrying the stored answer is added in the same step, so an answer is
        announced exactly once even when its writer dies right after. Returns True
        when stored.
        """
        version = answer.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError(f"answer needs an int 'version', got {version!r}")
        body = {**answer, "id": qid}
        body.setdefault("computed_at", time.time())
        return bool(self._store_answer(
            keys=[self.key(sid, "flash"), self.key(sid, "answers"), self.key(sid, "answer_ver"),
                  self.key(sid, "events")],
            args=[qid, version, json.dumps(body), int(publish), self.max_events]))

    @guarded
    def answer(self, sid: str, qid: str) -> dict | None:
        """The stored answer of a question (any version), or None."""
        raw = self.client.hget(self.key(sid, "answers"), qid)
        return None if raw is None else json.loads(raw)

    @guarded
    def answer_versions(self, sid: str) -> dict[str, int]:
        """qid -> version of its stored answer (questions without one are absent)."""
        return {as_str(k): int(v) for k, v in self.client.hgetall(self.key(sid, "answer_ver")).items()}

    @guarded
    def lookup(self, sid: str, question: str, version: int) -> dict | None:
        """The stored answer of a registered question at exactly `version`, else None.

        Matches the normalized text; an answer of any other version (older: stale;
        newer: not the data the caller saw) is never returned.
        """
        qid = self.client.hget(self.key(sid, "flash_norm"), normalize_question(question))
        if qid is None:
            return None
        found = self.answer(sid, as_str(qid))
        return found if found is not None and found.get("version") == version else None

    @guarded
    def lookup_current(self, sid: str, question: str) -> dict | None:
        """`lookup` at the session's current version, reading the version and the
        question's id in one round trip (a query's path: most questions are not
        registered, and then that is the only one)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.key(sid, "version"))
        pipe.hget(self.key(sid, "flash_norm"), normalize_question(question))
        raw_version, qid = pipe.execute()
        if raw_version is None or int(raw_version) == 0 or qid is None:
            return None  # no data version yet, or not a registered question
        found = self.answer(sid, as_str(qid))
        return found if found is not None and found.get("version") == int(raw_version) else None

    def _answers(self, sid: str, qids: list[str]) -> dict[str, dict]:
        if not qids:
            return {}
        raws = self.client.hmget(self.key(sid, "answers"), qids)
        return {qid: json.loads(raw) for qid, raw in zip(qids, raws) if raw is not None}
