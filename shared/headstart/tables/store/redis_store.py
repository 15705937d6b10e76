"""`redis://host:port/db`: blocks shared by every engine replica through a real Redis.

Layout in Redis (key names: see `headstart.tables.keys`):

    {block key}        string: the block's bytes (`block_codec`, safetensors)
    {scope}:#index     hash:   table name -> block key, one per
                       (model, dtype, db, schema hash)

Writes put the payload first and the index entry second, so whoever lists
the index finds payloads (a crash in between leaves an orphan payload, not a
dangling entry). Deletes go the other way round. With a TTL both the payload
and the index get it (the index's is refreshed by every put); entries that
outlive their payload are misses until `clean_orphans()` removes them.

URL parameters (all optional):
    ttl_s            expiry of payloads and indexes, seconds (none by default)
    max_connections  connection pool cap (8); callers wait up to pool_timeout_s
    pool_timeout_s   wait for a free pooled connection (5.0)
    socket_timeout_s per-command socket timeout (5.0)
    connect_timeout_s connect timeout (1.0)
e.g. `redis://127.0.0.1:6379/0?ttl_s=86400&max_connections=16`.

Every Redis failure is raised as `StoreUnavailableError` (or `StoreError`);
wrap the store in `FallbackStore` where a failure must become a miss.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from headstart.tables.block import TableBlock
from headstart.tables.block_codec import BlockCodecError, decode_block, encode_block
from headstart.tables.keys import NAMESPACE, BlockId, BlockScope, is_index_key
from headstart.tables.store.base import BlockStore, CorruptBlockError, StoreError, StoreUnavailableError

log = logging.getLogger(__name__)

_PARAMS = {
    "ttl_s": int,
    "max_connections": int,
    "pool_timeout_s": float,
    "socket_timeout_s": float,
    "connect_timeout_s": float,
}


@dataclass(frozen=True)
class OrphanReport:
    """What `clean_orphans` removed, and the orphan payloads it left as too young."""

    num_index_entries_removed: int
    num_payloads_removed: int
    num_payloads_kept_young: int


class RedisStore(BlockStore):
    """Block store on a Redis server (see module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        ttl_s: int | None = None,
        max_connections: int = 8,
        pool_timeout_s: float = 5.0,
        socket_timeout_s: float = 5.0,
        connect_timeout_s: float = 1.0,
    ) -> None:
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.url = url
        self.ttl_s = ttl_s
        # NOTE: one retry without backoff replaces a pooled connection that a
        # server restart closed; more retries only lengthen an outage's stalls.
        self._pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_timeout_s,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 1),
        )
        self._client = redis.Redis(connection_pool=self._pool)

    @classmethod
    def from_url(cls, url: str) -> "RedisStore":
        """Build from `redis://host:port/db?param=value` (parameters in module docstring).

        Raises:
            ValueError: an unknown parameter or a malformed value.
        """
        parts = urlsplit(url)
        params = parse_qs(parts.query, keep_blank_values=True)
        unknown = set(params) - set(_PARAMS)
        if unknown:
            raise ValueError(f"{url!r}: unknown parameters {sorted(unknown)}; valid: {sorted(_PARAMS)}")
        kwargs = {}
        for name, values in params.items():
            try:
                kwargs[name] = _PARAMS[name](values[-1])
            except ValueError:
                raise ValueError(f"{url!r}: {name}={values[-1]!r} is not a {_PARAMS[name].__name__}") from None
        base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        store = cls(base, **kwargs)
        store.url = url
        return store

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailableError(f"redis {what}: {exc}") from exc
        except redis.RedisError as exc:
            raise StoreError(f"redis {what}: {exc}") from exc

    def ping(self) -> bool:
        """True when the server answers (never raises)."""
        try:
            return bool(self._client.ping())
        except redis.RedisError:
            return False

    def get(self, block_id: BlockId) -> TableBlock | None:
        with self._errors(f"get {block_id.key}"):
            data = self._client.get(block_id.key)
        if data is None:
            return None
        try:
            block = decode_block(data)
        except BlockCodecError as exc:
            raise CorruptBlockError(f"{block_id.key}: {exc}") from exc
        if block.block_id != block_id:
            raise CorruptBlockError(f"{block_id.key} holds the block of {block.block_id}")
        return block

    def put(self, block: TableBlock) -> None:
        data = encode_block(block)
        index_key = block.block_id.scope.index_key
        with self._errors(f"put {block.key}"):
            self._client.set(block.key, data, ex=self.ttl_s)  # payload first...
            pipe = self._client.pipeline(transaction=True)
            pipe.hset(index_key, block.table, block.key)  # ...then its index entry
            if self.ttl_s is not None:
                pipe.expire(index_key, self.ttl_s)
            pipe.execute()

    def delete(self, block_id: BlockId) -> bool:
        with self._errors(f"delete {block_id.key}"):
            self._client.hdel(block_id.scope.index_key, block_id.table)  # index first...
            return bool(self._client.delete(block_id.key))  # ...then the payload

    def contains(self, block_id: BlockId) -> bool:
        with self._errors(f"exists {block_id.key}"):
            return bool(self._client.exists(block_id.key))

    def payload_bytes(self, block_ids: list[BlockId]) -> int:
        """Encoded bytes of these blocks' payloads in Redis (absent ones count 0),
        without transferring them (STRLEN). Used by the table-cache service's status."""
        with self._errors("payload_bytes"):
            pipe = self._client.pipeline(transaction=False)
            for block_id in block_ids:
                pipe.strlen(block_id.key)
            return int(sum(pipe.execute()))

    def list(self, scope: BlockScope) -> list[str]:
        with self._errors(f"list {scope.index_key}"):
            fields = self._client.hkeys(scope.index_key)
        return sorted(f.decode("utf-8") for f in fields)

    def clean_orphans(self, scope: BlockScope | None = None, *, grace_s: float = 60.0) -> OrphanReport:
        """Remove index entries whose payload is gone and payloads no index names.

        A payload without an index entry may be a `put` between its two
        writes: it is only removed once idle for `grace_s` seconds (Redis
        OBJECT IDLETIME; never removed when the server cannot tell, e.g. under
        an LFU maxmemory policy). `grace_s=0` removes them all at once.

        Args:
            scope: limit the sweep to one scope; all of `headstart:tables:v1` when None.
        """
        pattern = (scope.prefix if scope is not None else NAMESPACE + ":") + "*"
        with self._errors("clean_orphans"):
            indexes: list[str] = []
            payloads: set[str] = set()
            for raw in self._client.scan_iter(match=pattern, count=1000):
                key = raw.decode("utf-8")
                if is_index_key(key):
                    indexes.append(key)
                else:
                    payloads.add(key)
            referenced: set[str] = set()
            num_entries = 0
            for index_key in indexes:
                entries = {t.decode("utf-8"): k.decode("utf-8") for t, k in self._client.hgetall(index_key).items()}
                pipe = self._client.pipeline(transaction=False)
                for key in entries.values():
                    pipe.exists(key)
                alive = pipe.execute()
                stale = [t for (t, _), ok in zip(entries.items(), alive) if not ok]
                if stale:
                    num_entries += self._client.hdel(index_key, *stale)
                referenced |= {k for (_, k), ok in zip(entries.items(), alive) if ok}
            num_removed = num_young = 0
            for key in sorted(payloads - referenced):
                if grace_s > 0 and not self._idle_for(key, grace_s):
                    num_young += 1
                    continue
                num_removed += self._client.delete(key)
        if num_entries or num_removed:
            log.info("redis store: removed %d stale index entries, %d orphan payloads", num_entries, num_removed)
        return OrphanReport(num_entries, num_removed, num_young)

    def _idle_for(self, key: str, seconds: float) -> bool:
        try:
            idle = self._client.object("idletime", key)
        except redis.ResponseError:
            return False
        return idle is not None and idle >= seconds

    def close(self) -> None:
        self._pool.disconnect()
