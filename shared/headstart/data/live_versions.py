"""The versions stream's consumer side (the flash worker's): read, ack, take over.

Engine replicas add an entry to `{prefix}:data:versions` per data version
(`LiveStore.publish_version`); flash workers read it in the consumer group
`flash`. An entry stays pending until acknowledged, so a worker that dies
finds its entries again (`own_pending`) and another takes over those of a
worker gone for good (`claim_versions`, XAUTOCLAIM).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from headstart.data.live_errors import as_str, guarded

VERSIONS_GROUP = "flash"


@dataclass(frozen=True)
class VersionEntry:
    """One entry of the global versions stream, as the flash worker reads it."""

    entry_id: str
    session_id: str
    tenant: str
    version: int
    rows_added: int
    dropped_total: int
    lag_versions: int = 0  # acknowledged pushes behind this version on the replica (a newer one is coming)


class VersionsConsumer:
    """Mixed into `LiveStore`: needs `client`, `versions_key` and `_max_block_ms`."""

    client: redis.Redis
    versions_key: str
    _max_block_ms: int
    _group_ready: bool = False

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
            f = {as_str(k): as_str(v) for k, v in fields.items()}
            out.append(VersionEntry(as_str(entry_id), f["sid"], f["tenant"], int(f["version"]), int(f["rows_added"]),
                                    int(f["dropped_total"]), int(f.get("lag_versions", 0))))
        return out

    def _in_group(self, call):
        """`call()` on the group, created first; once more after a NOGROUP (the stream was
        deleted under a running worker, e.g. FLUSHDB: the group goes with it)."""
        self._ensure_group()
        try:
            return call()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._group_ready = False
            self._ensure_group()
            return call()

    @guarded
    def read_versions(self, consumer: str, count: int = 16, block_ms: int = 1000) -> list[VersionEntry]:
        """New version entries for `consumer` of the `flash` group (pending until `ack_version`)."""
        block = min(block_ms, self._max_block_ms) if block_ms > 0 else None
        reply = self._in_group(lambda: self.client.xreadgroup(
            VERSIONS_GROUP, consumer, {self.versions_key: ">"}, count=count, block=block))
        return [e for _stream, entries in reply or [] for e in self._entries(entries)]

    @guarded
    def own_pending(self, consumer: str, count: int = 100) -> list[VersionEntry]:
        """Entries delivered to `consumer` and never acked (a restart under the same name)."""
        reply = self._in_group(lambda: self.client.xreadgroup(
            VERSIONS_GROUP, consumer, {self.versions_key: "0"}, count=count))
        return [e for _stream, entries in reply or [] for e in self._entries(entries)]

    @guarded
    def claim_versions(self, consumer: str, min_idle_ms: int, count: int = 100) -> list[VersionEntry]:
        """Take over entries other consumers left pending for `min_idle_ms` (XAUTOCLAIM)."""
        claimed: list[VersionEntry] = []
        start = "0-0"
        while len(claimed) < count:
            reply = self._in_group(lambda: self.client.xautoclaim(
                self.versions_key, VERSIONS_GROUP, consumer, min_idle_ms, start_id=start, count=count - len(claimed)))
            start, entries = as_str(reply[0]), reply[1]
            claimed.extend(self._entries(entries))
            if start == "0-0":
                break
        return claimed

    @guarded
    def prune_consumers(self, keep: str, min_idle_ms: int) -> list[str]:
        """Forget consumers with nothing pending, idle for `min_idle_ms` (pods that are gone:
        a Deployment's pods get new names), except `keep`. Returns the names removed."""
        removed = []
        for info in self._in_group(lambda: self.client.xinfo_consumers(self.versions_key, VERSIONS_GROUP)):
            name = as_str(info["name"])
            if name != keep and int(info["pending"]) == 0 and int(info["idle"]) >= min_idle_ms:
                # NOTE: DELCONSUMER drops the consumer's pending entries: only ones with none go
                self.client.xgroup_delconsumer(self.versions_key, VERSIONS_GROUP, name)
                removed.append(name)
        return removed

    @guarded
    def ack_version(self, entry_id: str) -> None:
        """Acknowledge an entry once its answers are stored (it leaves the pending list)."""
        self.client.xack(self.versions_key, VERSIONS_GROUP, entry_id)

    @guarded
    def num_pending_versions(self) -> int:
        """Entries delivered to some consumer and not acked yet."""
        return int(self._in_group(lambda: self.client.xpending(self.versions_key, VERSIONS_GROUP))["pending"])
