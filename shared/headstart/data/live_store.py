"""The live state of data sessions in Redis: rows log, versions, events, flash questions and answers.

Shared by the gateway (rows, meta, flash registry, events for SSE), the engine
replicas (they publish each data version) and the flash worker (it consumes the
versions and stores answers). Layout, with `P` the prefix and `S` the
engine-level session id (tenant-scoped, `services/gateway/sessions.py`):

    P:data:S:seq         string  last row sequence number handed out (INCRBY)
    P:data:S:rows        zset    JSON [seq, row] scored by seq: the rebuild source, newest `max_rows`
    P:data:S:meta        string  JSON dict (db, tenant, settings: the gateway's)
    P:data:S:version     string  current data version (only ever moves forward)
    P:data:S:events      stream  kind, payload (JSON); MAXLEN ~ `max_events`: SSE / Subscribe
    P:data:S:flash       hash    qid -> question (normalized), at most `max_flash`
    P:data:S:flash_norm  hash    question -> qid (one qid per question)
    P:data:S:flash_seq   string  last qid number
    P:data:S:answers     hash    qid -> JSON answer {question, version, sql, ..., computed_at}
    P:data:S:answer_ver  hash    qid -> version of the stored answer
    P:data:versions      stream  sid, tenant, version, rows_added, dropped_total; group `flash`

Every check-then-write (a version moving forward, the flash bound, an answer
never replaced by an older one) is one Lua script, so concurrent writers
(two worker processes, a replica rebuilt beside its predecessor) cannot
interleave between the check and the write.

Redis failures are raised as `LiveStoreUnavailable` (connection, timeout) or
`LiveStoreError`, both `HeadstartError`s the edges map to a status.
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from headstart.engine.errors import HeadstartError, ResourceExhausted

VERSIONS_GROUP = "flash"
EVENT_KINDS = ("data_updated", "flash_ready", "rows_dropped")
_SESSION_KEYS = ("seq", "rows", "meta", "version", "events", "flash", "flash_norm", "flash_seq", "answers",
                 "answer_ver")


class LiveStoreError(HeadstartError):
    """Redis answered with an error (wrong type, a script error)."""


class LiveStoreUnavailable(LiveStoreError):
    """Redis cannot be reached (connection refused, timeout)."""

    code = "UNAVAILABLE"


class FlashLimitExceeded(ResourceExhausted):
    """The session already has `max_flash` registered questions."""


class LiveEvent(NamedTuple):
    """One event of a session's stream: its Redis stream id (the SSE `id:`), kind and payload."""

    id: str
    kind: str
    payload: dict


@dataclass(frozen=True)
class VersionEntry:
    """One entry of the global versions stream, as the flash worker reads it."""

    entry_id: str
    session_id: str
    tenant: str
    version: int
    rows_added: int
    dropped_total: int


def normalize_question(question: str) -> str:
    """The text a question is registered and matched by: stripped, whitespace runs as one space.

    NOTE: case and punctuation are kept: they change the model's tokens, and a
    flash answer must equal what the model gives for the question asked. The
    gateway sends the normalized text to the model too, so both agree exactly.
    """
    return re.sub(r"\s+", " ", question).strip()


def _str(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _guarded(method):
    """Raise Redis failures of a public method as this module's typed errors."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise LiveStoreUnavailable(f"redis {method.__name__}: {exc}") from exc
        except redis.RedisError as exc:
            raise LiveStoreError(f"redis {method.__name__}: {exc}") from exc

    return wrapper


# KEYS: version, versions stream, events stream
# ARGV: version, sid, tenant, rows_added, dropped_total, versions maxlen, events maxlen, event payload
_PUBLISH_VERSION = """
local v = tonumber(ARGV[1])
if v <= tonumber(redis.call('GET', KEYS[1]) or '0') then return false end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'sid', ARGV[2], 'tenant', ARGV[3],
           'version', ARGV[1], 'rows_added', ARGV[4], 'dropped_total', ARGV[5])
return redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'kind', 'data_updated', 'payload', ARGV[8])
"""

# KEYS: flash, flash_norm, flash_seq   ARGV: question, max_flash  ->  {status, qid}
_REGISTER_FLASH = """
local existing = redis.call('HGET', KEYS[2], ARGV[1])
if existing then return {0, existing} end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[2]) then return {-1, ''} end
local qid = 'q' .. redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], qid, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], qid)
return {1, qid}
"""

# KEYS: flash, flash_norm, answers, answer_ver   ARGV: qid  ->  1 when it was registered
_DELETE_FLASH = """
local question = redis.call('HGET', KEYS[1], ARGV[1])
if not question then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HGET', KEYS[2], question) == ARGV[1] then redis.call('HDEL', KEYS[2], question) end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
"""

# KEYS: flash, answers, answer_ver, events   ARGV: qid, version, answer JSON, publish (0/1), events maxlen
#   ->  0 when not stored, else 1 or the flash_ready event's id
_STORE_ANSWER = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if tonumber(ARGV[2]) <= tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '-1') then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if ARGV[4] == '1' then
  return redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'flash_ready', 'payload', ARGV[3])
end
return 1
"""


class LiveStore:
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
    ) -> None:
        for name, value in (("max_rows", max_rows), ("max_events", max_events), ("max_flash", max_flash),
                            ("max_version_events", max_version_events)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if isinstance(redis_url_or_client, str):
            pool = redis.BlockingConnectionPool.from_url(
                redis_url_or_client, max_connections=max_connections, timeout=socket_timeout_s,
                socket_timeout=socket_timeout_s, socket_connect_timeout=2.0)
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
        self._publish_version = self.client.register_script(_PUBLISH_VERSION)
        self._register_flash = self.client.register_script(_REGISTER_FLASH)
        self._delete_flash = self.client.register_script(_DELETE_FLASH)
        self._store_answer = self.client.register_script(_STORE_ANSWER)
        self._group_ready = False

    def key(self, sid: str, name: str) -> str:
        """The Redis key of one part of a session's state (`name` from the module docstring)."""
        return f"{self.prefix}:data:{sid}:{name}"

    def close(self) -> None:
        """Close the connection pool built from a URL (a client passed in stays open)."""
        if self._owns_client:
            self.client.close()

    @_guarded
    def ping(self) -> bool:
        return bool(self.client.ping())

    # ---- rows log -------------------------------------------------------------------

    @_guarded
    def next_seqs(self, sid: str, n: int) -> list[int]:
        """`n` fresh, increasing sequence numbers for the session's next rows (one INCRBY)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        last = int(self.client.incrby(self.key(sid, "seq"), n))
        return list(range(last - n + 1, last + 1))

    @_guarded
    def append_rows(self, sid: str, rows: list[tuple[int, dict]]) -> None:
        """Persist rows (before the push is acked) and trim the log to `max_rows`.

        Kept in seq order whatever order concurrent pushes arrive in; appending
        the same (seq, row) again is a no-op (the member is the canonical JSON).
        """
        if not rows:
            return
        key = self.key(sid, "rows")
        members = {json.dumps([int(seq), row], sort_keys=True, separators=(",", ":")): int(seq) for seq, row in rows}
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(key, members)
        pipe.zremrangebyrank(key, 0, -(self.max_rows + 1))
        pipe.execute()

    @_guarded
    def rows(self, sid: str) -> list[tuple[int, dict]]:
        """The kept rows, oldest first: `[(seq, {"table": ..., "values": {...}})]`."""
        out = []
        for member in self.client.zrange(self.key(sid, "rows"), 0, -1):
            seq, row = json.loads(member)
            out.append((int(seq), row))
        return out

    # ---- session meta ---------------------------------------------------------------

    @_guarded
    def put_meta(self, sid: str, meta: dict) -> None:
        self.client.set(self.key(sid, "meta"), json.dumps(meta, sort_keys=True))

    @_guarded
    def meta(self, sid: str) -> dict | None:
        raw = self.client.get(self.key(sid, "meta"))
        return None if raw is None else json.loads(raw)

    @_guarded
    def delete_session(self, sid: str) -> None:
        """Remove all of a session's keys (its entries in the versions stream stay: the
        worker finds no question for them and acks them)."""
        self.client.delete(*(self.key(sid, name) for name in _SESSION_KEYS))

    # ---- versions -------------------------------------------------------------------

    @_guarded
    def publish_version(self, sid: str, tenant: str, version: int, rows_added: int, dropped_total: int) -> str | None:
        """A new data version of a session: sets `current_version`, adds an entry to the
        versions stream (the flash worker's) and a `data_updated` event, atomically.

        Returns the event id, or None when `version` is not newer than the current one
        (a replica rebuilt from the same rows publishes nothing twice).
        """
        payload = json.dumps({"version": int(version), "rows_added": int(rows_added),
                              "dropped_total": int(dropped_total)})
        event_id = self._publish_version(
            keys=[self.key(sid, "version"), self.versions_key, self.key(sid, "events")],
            args=[int(version), sid, tenant, int(rows_added), int(dropped_total), self.max_version_events,
                  self.max_events, payload])
        return None if event_id is None else _str(event_id)

    @_guarded
    def current_version(self, sid: str) -> int:
        """The session's newest published data version (0: none)."""
        raw = self.client.get(self.key(sid, "version"))
        return 0 if raw is None else int(raw)

    # ---- events ---------------------------------------------------------------------

    @_guarded
    def add_event(self, sid: str, kind: str, payload: dict) -> str:
        """Append an event to the session's stream (trimmed to about `max_events`); its id."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; valid: {list(EVENT_KINDS)}")
        return _str(self.client.xadd(self.key(sid, "events"), {"kind": kind, "payload": json.dumps(payload)},
                                     maxlen=self.max_events, approximate=True))

    @_guarded
    def events_after(self, sid: str, last_id: str | None, block_ms: int = 0, count: int = 100) -> list[LiveEvent]:
        """Events after `last_id` (an SSE `Last-Event-ID`), oldest first, at most `count`.

        `last_id` None or "0" reads from the oldest kept event; use `latest_event_id`
        to start at "now" without a gap. `block_ms` > 0 waits that long for one
        (capped below the socket timeout); 0 returns at once.
        """
        start = last_id or "0-0"
        block = min(block_ms, self._max_block_ms) if block_ms > 0 else None
        reply = self.client.xread({self.key(sid, "events"): start}, count=count, block=block)
        out = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                fields = {_str(k): _str(v) for k, v in fields.items()}
                out.append(LiveEvent(_str(entry_id), fields["kind"], json.loads(fields["payload"])))
        return out

    @_guarded
    def latest_event_id(self, sid: str) -> str:
        """Id of the session's newest event ("0-0": none), to subscribe from now on."""
        newest = self.client.xrevrange(self.key(sid, "events"), count=1)
        return _str(newest[0][0]) if newest else "0-0"

    # ---- flash registry -------------------------------------------------------------

    @_guarded
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
        return _str(qid)

    @_guarded
    def flash_questions(self, sid: str) -> dict[str, str]:
        """qid -> question, in registration order."""
        items = {_str(k): _str(v) for k, v in self.client.hgetall(self.key(sid, "flash")).items()}
        return dict(sorted(items.items(), key=lambda kv: int(kv[0][1:])))

    @_guarded
    def list_flash(self, sid: str) -> list[dict]:
        """`[{"id", "question", "answer"}]` in registration order (`answer` None until one is stored)."""
        questions = self.flash_questions(sid)
        answers = self._answers(sid, list(questions))
        return [{"id": qid, "question": q, "answer": answers.get(qid)} for qid, q in questions.items()]

    @_guarded
    def delete_flash(self, sid: str, qid: str) -> bool:
        """Forget a question and its answer; False when it was not registered."""
        return bool(self._delete_flash(
            keys=[self.key(sid, "flash"), self.key(sid, "flash_norm"), self.key(sid, "answers"),
                  self.key(sid, "answer_ver")], args=[qid]))

    # ---- flash answers --------------------------------------------------------------

    @_guarded
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

    @_guarded
    def answer(self, sid: str, qid: str) -> dict | None:
        """The stored answer of a question (any version), or None."""
        raw = self.client.hget(self.key(sid, "answers"), qid)
        return None if raw is None else json.loads(raw)

    @_guarded
    def answer_versions(self, sid: str) -> dict[str, int]:
        """qid -> version of its stored answer (questions without one are absent)."""
        return {_str(k): int(v) for k, v in self.client.hgetall(self.key(sid, "answer_ver")).items()}

    @_guarded
    def lookup(self, sid: str, question: str, version: int) -> dict | None:
        """The stored answer of a registered question at exactly `version`, else None.

        Matches the normalized text; an answer of any other version (older: stale;
        newer: not the data the caller saw) is never returned.
        """
        qid = self.client.hget(self.key(sid, "flash_norm"), normalize_question(question))
        if qid is None:
            return None
        found = self.answer(sid, _str(qid))
        return found if found is not None and found.get("version") == version else None

    def _answers(self, sid: str, qids: list[str]) -> dict[str, dict]:
        if not qids:
            return {}
        raws = self.client.hmget(self.key(sid, "answers"), qids)
        return {qid: json.loads(raw) for qid, raw in zip(qids, raws) if raw is not None}

    # ---- the versions consumer (flash worker) ---------------------------------------

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            # from id 0: versions published before the first worker started are answered too
            self.client.xgroup_create(self.versions_key, VERSIONS_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _entries(self, entries) -> list[VersionEntry]:
        out = []
        for entry_id, fields in entries:
            if not fields:  # trimmed from the stream while pending: nothing to answer
                self.client.xack(self.versions_key, VERSIONS_GROUP, entry_id)
                continue
            f = {_str(k): _str(v) for k, v in fields.items()}
            out.append(VersionEntry(_str(entry_id), f["sid"], f["tenant"], int(f["version"]), int(f["rows_added"]),
                                    int(f["dropped_total"])))
        return out

    @_guarded
    def read_versions(self, consumer: str, count: int = 16, block_ms: int = 1000) -> list[VersionEntry]:
        """New version entries for `consumer` of the `flash` group (pending until `ack_version`)."""
        self._ensure_group()
        block = min(block_ms, self._max_block_ms) if block_ms > 0 else None
        try:
            reply = self.client.xreadgroup(VERSIONS_GROUP, consumer, {self.versions_key: ">"}, count=count,
                                           block=block)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._group_ready = False  # the stream was deleted (FLUSHDB): create the group again
            return []
        return [e for _stream, entries in reply or [] for e in self._entries(entries)]

    @_guarded
    def own_pending(self, consumer: str, count: int = 100) -> list[VersionEntry]:
        """Entries delivered to `consumer` and never acked (a restart under the same name)."""
        self._ensure_group()
        reply = self.client.xreadgroup(VERSIONS_GROUP, consumer, {self.versions_key: "0"}, count=count)
        return [e for _stream, entries in reply or [] for e in self._entries(entries)]

    @_guarded
    def claim_versions(self, consumer: str, min_idle_ms: int, count: int = 100) -> list[VersionEntry]:
        """Take over entries other consumers left pending for `min_idle_ms` (XAUTOCLAIM)."""
        self._ensure_group()
        claimed: list[VersionEntry] = []
        start = "0-0"
        while len(claimed) < count:
            reply = self.client.xautoclaim(self.versions_key, VERSIONS_GROUP, consumer, min_idle_ms,
                                           start_id=start, count=count - len(claimed))
            start, entries = _str(reply[0]), reply[1]
            claimed.extend(self._entries(entries))
            if start == "0-0":
                break
        return claimed

    @_guarded
    def ack_version(self, entry_id: str) -> None:
        """Acknowledge an entry once its answers are stored (it leaves the pending list)."""
        self.client.xack(self.versions_key, VERSIONS_GROUP, entry_id)

    @_guarded
    def num_pending_versions(self) -> int:
        """Entries delivered to some consumer and not acked yet."""
        self._ensure_group()
        return int(self.client.xpending(self.versions_key, VERSIONS_GROUP)["pending"])
