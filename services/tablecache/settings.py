"""Table-cache service configuration: one pydantic object built at the edge (env, CLI, tests)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class TableCacheSettings(BaseSettings):
    """The service's own settings (env prefix `HEADSTART_TABLECACHE_`).

    The model, dtype, device, mode (`table_cache`) and block store
    (`table_store_url`) are the engine's `EngineSettings` (env `HEADSTART_`),
    so the service writes exactly the keys the engine replicas read.
    """

    model_config = SettingsConfigDict(env_prefix="HEADSTART_TABLECACHE_", extra="forbid")

    host: str = Field("127.0.0.1", description="gRPC bind address")
    port: int = Field(50061, ge=0, description="gRPC port (0: any free port)")
    check_interval_s: float = Field(
        300.0, ge=0, description="seconds between schema checks and orphan sweeps (0: never)")
    orphan_grace_s: float = Field(60.0, ge=0, description="orphan payloads younger than this are kept")
    auto_precompute: bool = Field(True, description="precompute a database again when its schema changed")
