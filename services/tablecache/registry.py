"""Which databases the service has registered, and at which schema hash.

The service must remember a database's last schema hash across restarts to
find (and delete) the blocks of an old schema version when the schema changes.
With a Redis block store the registry is a Redis hash beside the blocks:

    headstart:tablecache:v1:{model}:{dtype}:{mode}:#databases   spec -> JSON

(a spec may be a DSN with a password: Redis is password-protected and, in the
chart, reachable only from the engine and this service). With `memory://` it
lives in this process only.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import redis

from headstart.tables.keys import sanitize

NAMESPACE = "headstart:tablecache:v1"


@dataclass(frozen=True)
class Registration:
    """A registered database: its spec and the schema version its blocks were made for."""

    spec: str
    db_id: str
    schema_hash: str


class DatabaseRegistry:
    """Registrations of one (model, dtype, mode); thread-safe."""

    def __init__(self, store_url: str, *, model_id: str, dtype: str, mode: str) -> None:
        self.key = f"{NAMESPACE}:{sanitize(model_id)}:{sanitize(dtype)}:{sanitize(mode)}:#databases"
        self._memory: dict[str, Registration] = {}
        self._lock = threading.Lock()
        scheme = urlsplit(store_url).scheme
        self._client = redis.Redis.from_url(store_url.split("?")[0]) if scheme in ("redis", "rediss") else None

    def put(self, reg: Registration) -> None:
        with self._lock:
            self._memory[reg.spec] = reg
        if self._client is not None:
            self._client.hset(self.key, reg.spec, json.dumps(asdict(reg)))

    def get(self, spec: str) -> Registration | None:
        if self._client is not None:
            raw = self._client.hget(self.key, spec)
            return Registration(**json.loads(raw)) if raw is not None else None
        with self._lock:
            return self._memory.get(spec)

    def all(self) -> list[Registration]:
        if self._client is not None:
            return sorted((Registration(**json.loads(v)) for v in self._client.hgetall(self.key).values()),
                          key=lambda r: r.spec)
        with self._lock:
            return sorted(self._memory.values(), key=lambda r: r.spec)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
