"""Data sessions' event streams for SSE and gRPC `Subscribe`: async reads, a pool per tenant, resume checks.

**Isolation.** A subscriber waits on Redis (`XREAD BLOCK`) for its
session's next events. Those reads are async (`redis.asyncio`: no thread
held per subscriber) and use a connection pool of the subscriber's tenant,
as large as its connection share (a subscriber counts in that share). One
tenant's idle subscribers hold only their own pool, never the connections
or threads every other data call uses (issue 29: 120 idle SSE streams of
one tenant once made another tenant's push take 2 s, 64 reader threads
each holding a connection of the one shared pool for a second at a time).

**Resume.** A `last_event_id` names an event the client saw. It must be a
stream id (`ms-seq`, each part below 2^64: else INVALID_ARGUMENT), not newer
than the newest id the stream ever gave (else it was never given:
OUT_OF_RANGE), and, once the stream has been trimmed (it keeps about 1000
events), not older than the oldest event kept (else events after it are
gone: OUT_OF_RANGE, so a client never resumes across a silent gap). The
error says the oldest id kept; a client that accepts the gap resumes from
`0` (everything kept). None or empty: from now on.

**Redis going away** mid-stream ends it with UNAVAILABLE (retryable: the
client resumes from its last id once Redis is back; the data API's Redis
runs with an append-only file, so the events are still there).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable

import redis
import redis.asyncio as aioredis

from headstart.client.errors import ApiError
from headstart.data.live_errors import as_str
from headstart.data.live_store import LiveEvent

MAX_ID_PART = (1 << 64) - 1  # a Redis stream id is two unsigned 64-bit numbers
READ_COUNT = 100
CLIENT_NAME = "hs-events"  # + ":tenant": whose subscribers a connection serves (Redis CLIENT LIST)
POOL_WAIT_S = 5.0  # a subscriber never waits for its pool (it is as large as the share), but never forever


class ResumeOutOfRange(ApiError):
    """A resume id outside what the stream kept: OUT_OF_RANGE, with the oldest and newest ids kept."""

    def __init__(self, message: str, oldest_id: str, newest_id: str):
        super().__init__("OUT_OF_RANGE", f"{message} (oldest event kept: {oldest_id}; resume from it, "
                                         "or from 0 for every event kept)")
        self.oldest_id, self.newest_id = oldest_id, newest_id


def parse_event_id(text: str) -> tuple[int, int]:
    """(ms, seq) of a stream id `ms-seq` or `ms`; INVALID_ARGUMENT when it is none (or a part is >= 2^64)."""
    ms, sep, seq = text.partition("-")
    if not ms.isdigit() or (sep and not seq.isdigit()) or len(text) > 41:
        raise ApiError("INVALID_ARGUMENT", f"last_event_id {text[:44]!r} is not an event id (like 1732441000000-0)")
    parts = (int(ms), int(seq or 0))
    if max(parts) > MAX_ID_PART:
        raise ApiError("INVALID_ARGUMENT", f"last_event_id {text[:44]!r} is not an event id (a part above 2^64-1)")
    return parts


def _id(parts: tuple[int, int]) -> str:
    return f"{parts[0]}-{parts[1]}"


def unavailable(exc: BaseException) -> ApiError:
    return ApiError("UNAVAILABLE", f"the data store (Redis) is unreachable ({type(exc).__name__}); "
                                   "resume from your last event id")


class EventStreams:
    """Subscribers' reads of sessions' event streams (module docstring).

    Args:
        url: the data API's Redis.
        key: `key(session, part)` -> the Redis key (LiveStore.key: the layout is the store's).
        share: subscribers a tenant may hold at once (its connection share): its pool's size.
        socket_timeout_s: above the longest blocking read.
    """

    def __init__(self, url: str, key: Callable[[str, str], str], share: int, socket_timeout_s: float = 30.0):
        self._url, self._key, self._share = url, key, max(1, share)
        self._timeout = socket_timeout_s
        self._clients: dict[str, aioredis.Redis] = {}

    def _client(self, tenant: str) -> aioredis.Redis:
        client = self._clients.get(tenant)
        if client is None:
            pool = aioredis.BlockingConnectionPool.from_url(
                self._url, max_connections=self._share, timeout=POOL_WAIT_S, socket_timeout=self._timeout,
                socket_connect_timeout=2.0, client_name=f"{CLIENT_NAME}:{re.sub(r'[^A-Za-z0-9_.-]', '_', tenant)}")
            client = self._clients[tenant] = aioredis.Redis(connection_pool=pool)
        return client

    async def start(self, tenant: str, eid: str, last_id: str | None) -> str:
        """The id to read after: the newest one for None/empty, "0-0" for "0", else `last_id` checked.

        Raises:
            ApiError: INVALID_ARGUMENT (not an id), OUT_OF_RANGE (`ResumeOutOfRange`), UNAVAILABLE.
        """
        client, key = self._client(tenant), self._key(eid, "events")
        try:
            if not last_id:
                newest = await client.xrevrange(key, count=1)
                return as_str(newest[0][0]) if newest else "0-0"
            wanted = parse_event_id(last_id)
            if wanted == (0, 0):
                return "0-0"
            try:
                info = await client.xinfo_stream(key)
            except redis.ResponseError:  # no such key: no event was ever added
                raise ResumeOutOfRange(f"last_event_id {last_id} was never given: the session has no events",
                                       "0-0", "0-0") from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise unavailable(exc) from None
        newest = parse_event_id(as_str(info["last-generated-id"]))
        first = info.get("first-entry")
        oldest = parse_event_id(as_str(first[0])) if first else None
        trimmed = int(info.get("entries-added", info["length"])) > int(info["length"])
        kept = _id(oldest) if oldest else _id(newest)
        if wanted > newest:
            raise ResumeOutOfRange(f"last_event_id {last_id} is newer than the newest event, {_id(newest)}",
                                   kept, _id(newest))
        # NOTE: trimming takes the oldest entries; past it, an id older than the oldest kept may
        # have missed the ones removed (conservative by one: its own successor may be the oldest)
        if trimmed and wanted < (oldest or newest):
            raise ResumeOutOfRange(f"events after last_event_id {last_id} were dropped (a session keeps "
                                   "about its newest 1000)", kept, _id(newest))
        return _id(wanted)

    async def stream(self, tenant: str, eid: str, after: str, block_ms: int = 1000) -> AsyncIterator[LiveEvent | None]:
        """Events after `after`, oldest first, with None after each quiet read; ends when the
        session is closed. Raises ApiError(UNAVAILABLE) when Redis goes away."""
        client, key, meta = self._client(tenant), self._key(eid, "events"), self._key(eid, "meta")
        while True:
            try:
                reply = await client.xread({key: after}, count=READ_COUNT, block=block_ms)
                if not reply and not await client.exists(meta):
                    return  # closed meanwhile
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise unavailable(exc) from None
            if not reply:
                yield None  # a quiet tick: the edge may send a keep-alive
                continue
            for _stream, entries in reply:
                for entry_id, fields in entries:
                    fields = {as_str(k): as_str(v) for k, v in fields.items()}
                    after = as_str(entry_id)
                    yield LiveEvent(after, fields["kind"], json.loads(fields["payload"]))

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
