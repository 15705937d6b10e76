"""`TableCacheCore`: what the table-cache service does, without gRPC.

It loads the engine's model once, with a `ModelRunner` of its own (the
only code that calls the model; no kernels: precompute runs the model's
own forward, `ModelRunner.encode_rows`), and reuses `headstart.tables` for
all the work: `TableLayout` (block texts, groups, scope with the schema
hash), `TableCacheService.iter_precompute` (the one precompute) and the
block store.
A database's schema is read afresh on every register / precompute /
invalidate (no cache), so a changed schema is seen at once; the layout is
built exactly as an engine replica builds it from the same spec, so the keys
match.

Model forwards run one at a time (a lock): one precompute after another.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from headstart.config import EngineSettings
from headstart.engine.runner.model_runner import ModelRunner
from headstart.models import load_model
from headstart.prompt import PromptBuilder
from headstart.schema.resolve import resolve_database
from headstart.tables.device_tier import DeviceTier
from headstart.tables.layout import TableLayout
from headstart.tables.precompute import GroupProgress
from headstart.tables.service import TableCacheService
from headstart.tables.store import open_store
from services.tablecache.register import display_name
from services.tablecache.registry import DatabaseRegistry, Registration

log = logging.getLogger(__name__)


class TableCacheError(ValueError):
    """A request the service cannot serve as asked (the gRPC layer maps it to INVALID_ARGUMENT)."""


class NotRegisteredError(LookupError):
    """The database was never registered (NOT_FOUND)."""


@dataclass(frozen=True)
class DatabaseStatus:
    """Blocks, bytes and schema hash of one database version."""

    name: str
    db_id: str
    schema_hash: str
    model: str
    dtype: str
    mode: str
    num_tables: int
    num_groups: int
    num_blocks: int
    num_bytes: int
    key_prefix: str

    @property
    def complete(self) -> bool:
        return self.num_blocks == self.num_tables


@dataclass(frozen=True)
class Invalidation:
    changed: bool
    old_schema_hash: str
    new_schema_hash: str
    num_blocks_deleted: int
    status: DatabaseStatus


class TableCacheCore:
    """Args:
        settings: the engine's settings (model, dtype, device, `table_cache` mode,
            `table_store_url`); the mode must not be `off`.
    """

    def __init__(self, settings: EngineSettings) -> None:
        if settings.table_cache == "off":
            raise TableCacheError("the table-cache service needs a mode: set table_cache to pfk or independent")
        self.settings = settings
        self.loaded = load_model(settings.model, settings.dtype, settings.device, settings.tokenizer_dir,
                                 settings.seed, settings.weights)
        self.runner = ModelRunner(self.loaded.model)
        # fallback=False: a precompute must see a store failure, not turn it into a miss
        self.store = open_store(settings.table_store_url, fallback=False)
        self.tables = TableCacheService(self.loaded, mode=settings.table_cache, store=self.store,
                                        tier=DeviceTier(0, device=self.loaded.device))  # writes only
        self.registry = DatabaseRegistry(settings.table_store_url, model_id=self.loaded.model_id,
                                         dtype=self.loaded.dtype_name, mode=settings.table_cache)
        self._forward = threading.Lock()

    @property
    def model_id(self) -> str:
        return self.loaded.model_id

    @property
    def mode(self) -> str:
        return self.settings.table_cache

    # -- the API -------------------------------------------------------------

    def register(self, spec: str) -> DatabaseStatus:
        """Read the database's schema and remember it (the schema must load)."""
        layout = self.layout(spec)
        previous = self.registry.get(spec)
        if previous is None or previous.schema_hash != layout.scope.schema_hash:
            if previous is not None:
                log.info("%s: schema changed at registration (%s -> %s)", display_name(spec),
                         previous.schema_hash[:12], layout.scope.schema_hash[:12])
                self._delete_version(layout, previous.schema_hash)
            self.registry.put(Registration(spec, layout.db_id, layout.scope.schema_hash))
        return self._status(spec, layout)

    def precompute(self, spec: str, *, model: str = "", dtype: str = "", mode: str = "",
                   force: bool = False) -> Iterator[GroupProgress]:
        """Encode and store the database's missing blocks, yielding after each group.

        Registers the database first when it is not yet. `model`, `dtype` and
        `mode`, when given, must be this service's (it holds one model).
        """
        self._check_target(model, dtype, mode)
        self.register(spec)
        layout = self.layout(spec)
        with self._forward:
            yield from self.tables.iter_precompute(layout, self.runner, skip_existing=not force)

    def status(self, spec: str) -> DatabaseStatus:
        """Status of a registered database at its current schema."""
        self._registration(spec)
        return self._status(spec, self.layout(spec))

    def list(self) -> list[DatabaseStatus]:
        return [self.status(reg.spec) for reg in self.registry.all()]

    def invalidate(self, spec: str) -> Invalidation:
        """Read the schema again; on a new hash delete the old version's blocks and
        register the new one (its blocks are then missing until a precompute)."""
        previous = self._registration(spec)
        layout = self.layout(spec)
        new_hash = layout.scope.schema_hash
        deleted = 0
        if new_hash != previous.schema_hash:
            deleted = self._delete_version(layout, previous.schema_hash)
            self.registry.put(Registration(spec, layout.db_id, new_hash))
        return Invalidation(new_hash != previous.schema_hash, previous.schema_hash, new_hash, deleted,
                            self._status(spec, layout))

    def clean_orphans(self, grace_s: float = 60.0):
        """The store's orphan sweep (`RedisStore.clean_orphans`); None for a store without one."""
        clean = getattr(self.store, "clean_orphans", None)
        return clean(grace_s=grace_s) if clean is not None else None

    def check_all(self, *, precompute: bool = True, grace_s: float = 60.0) -> list[Invalidation]:
        """The periodic job: invalidate every registered database whose schema
        changed (and precompute its new blocks), then sweep orphans. A database
        that fails to load is logged and left as it is."""
        changed = []
        for reg in self.registry.all():
            try:
                result = self.invalidate(reg.spec)
                if result.changed:
                    changed.append(result)
                    if precompute:
                        for _ in self.precompute(reg.spec):
                            pass
            except Exception as exc:  # one broken database must not stop the sweep
                log.warning("%s: schema check failed: %s", display_name(reg.spec), exc)
        self.clean_orphans(grace_s)
        return changed

    def close(self) -> None:
        self.registry.close()
        self.tables.close()

    # -- helpers ---------------------------------------------------------------

    def layout(self, spec: str) -> TableLayout:
        """The database's layout from a fresh read of its schema (as an engine builds it)."""
        resolved = resolve_database(spec, spider_dir=self.settings.spider_dir)
        prompt = PromptBuilder(self.loaded.tokenizer, resolved.schema)
        return TableLayout.build(prompt, model_id=self.loaded.model_id, dtype=self.loaded.dtype_name,
                                 mode=self.mode)

    def _registration(self, spec: str) -> Registration:
        reg = self.registry.get(spec)
        if reg is None:
            raise NotRegisteredError(f"database {display_name(spec)!r} is not registered")
        return reg

    def _check_target(self, model: str, dtype: str, mode: str) -> None:
        # the model as configured (a hub id, `random:tiny`) or as keyed (`random:tiny@seed0`)
        mine = {"model": {self.model_id, self.settings.model}, "dtype": {self.loaded.dtype_name},
                "mode": {self.mode}}
        asked = {"model": model, "dtype": dtype, "mode": mode}
        wrong = [f"{k}={v!r}" for k, v in asked.items() if v and v not in mine[k]]
        if wrong:
            raise TableCacheError(f"this service precomputes for model={self.model_id!r} "
                                  f"dtype={self.loaded.dtype_name!r} mode={self.mode!r}, not {', '.join(wrong)}")

    def _delete_version(self, layout: TableLayout, old_hash: str) -> int:
        """Delete the blocks stored under an old schema hash of this database."""
        old = type(layout.scope)(layout.scope.model_id, layout.scope.dtype, layout.scope.db_id, old_hash)
        tables = self.store.list(old)
        return sum(self.store.delete(old.block_id(t)) for t in tables)

    def _status(self, spec: str, layout: TableLayout) -> DatabaseStatus:
        stored = set(self.store.list(layout.scope)) & set(layout.texts)
        return DatabaseStatus(
            display_name(spec), layout.db_id, layout.scope.schema_hash, self.model_id, self.loaded.dtype_name,
            self.mode, len(layout.texts), len(layout.groups), len(stored), self._bytes(layout, stored),
            layout.scope.prefix)

    def _bytes(self, layout: TableLayout, tables: set[str]) -> int:
        sizes = getattr(self.store, "payload_bytes", None)
        if sizes is not None:
            return sizes([layout.scope.block_id(t) for t in sorted(tables)])
        total = 0
        for t in tables:
            block = self.store.get(layout.scope.block_id(t))
            total += block.num_bytes if block is not None else 0
        return total
