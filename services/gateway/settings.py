"""Gateway configuration: one pydantic object built at the edge (CLI, env, tests)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """Every field can be set from the environment with the `HEADSTART_GATEWAY_` prefix."""

    model_config = SettingsConfigDict(env_prefix="HEADSTART_GATEWAY_", extra="forbid")

    host: str = Field("127.0.0.1", description="HTTP/WebSocket bind address")
    port: int = Field(8080, ge=0, description="HTTP/WebSocket port (0: any free port)")
    grpc_host: str = Field("127.0.0.1", description="public gRPC bind address")
    grpc_port: int = Field(50051, ge=0, description="public gRPC port (0: any free port)")
    engine_target: str = Field("127.0.0.1:9000", description="host:port of Serve's gRPC proxy")
    engine_app: str = Field("headstart-engine", description="Serve application name of the engine")
    engine_direct: bool = Field(True, description="open session streams at the replica's own port (Locate) "
                                "instead of through Serve's proxy (services/engine/direct.py)")
    tokens: dict[str, str] = Field(default_factory=dict, description="bearer token -> tenant; empty: no auth")
    policy: str = Field("headstart", description="confirmation policy of typing sessions")
    max_message_bytes: int = Field(16_384, ge=256, description="largest client message (WS frame / gRPC message)")
    max_text_chars: int = Field(4000, ge=1, description="longest question text")
    rate_per_s: float = Field(60.0, gt=0, description="messages per second per connection (sustained)")
    rate_burst: int = Field(120, ge=1, description="messages a connection may send at once")
    default_max_new_tokens: int = Field(128, ge=1, description="answer tokens when a submit or completion asks none")
    max_new_tokens_limit: int = Field(512, ge=1, description="most answer tokens a client may ask for")
    max_sessions_per_tenant: int = Field(256, ge=1, description="sessions one tenant may hold, at most "
                                         "(its share is engine_capacity / tenants below that)")
    reconnect_timeout_s: float = Field(60.0, gt=0, description="how long a broken engine stream is retried")
    execute_row_limit: int = Field(20, ge=1, description="rows returned by the page's read-only Run")
    execute_timeout_s: float = Field(5.0, gt=0, description="a Run's deadline (then CANCELLED)")
    max_candidates: int = Field(8, ge=1, le=16, description="most candidates (`candidates`) one submit or "
                                "completion may ask for (each is a row of the engine's forwards)")
    spider_dir: Path | None = Field(None, description="Spider data dir (default ../shared/data/spider)")
    # -- the OpenAI-compatible API (services/gateway/openai_api.py) ----------
    served_model: str = Field("headstart", min_length=1, description="the model id GET /v1/models lists and a "
                              "completion's `model` names (`headstart serve`: its --model)")
    openai_database: str = Field("", description="the database of an OpenAI completion that names none "
                                 "(empty: `database` is required)")
    openai_max_n: int = Field(4, ge=1, le=16, description="most choices (`n`) one OpenAI completion may ask for; "
                              "each takes one of the tenant's completion slots")
    # -- tenant safety (docs/operations.md "Security"; limits: docs/configuration.md) -
    engine_secret: str = Field("", repr=False, description="sent to the engine on every call "
                               "(empty: $HEADSTART_ENGINE_SECRET or the file in $HEADSTART_ENGINE_SECRET_FILE)")
    sqlite_roots: list[Path] = Field(default_factory=list, description="folders whose SQLite files are served "
                                     "by name (with $HEADSTART_CATALOGUE_SQLITE_ROOTS)")
    engine_capacity: int = Field(0, ge=0, description="replicas x sessions per replica; each tenant's session "
                                 "share is capacity / tenants (0: only max_sessions_per_tenant)")
    session_idle_s: float = Field(900.0, gt=0, description="a REST/gRPC-opened session nobody is attached to "
                                  "closes after this long without a message")
    tenant_chars_per_s: float = Field(1_000.0, gt=0, description="characters to prefill per second per tenant "
                                      "(all its connections together)")
    tenant_chars_burst: int = Field(8_000, ge=1, description="characters a tenant may send at once "
                                    "(two pasted questions of max_text_chars)")
    completes_per_tenant: int = Field(4, ge=1, description="one-shot completions a tenant may run at once")
    execute_cell_bytes: int = Field(4096, ge=16, description="a Run cell longer than this is cut (marked)")
    execute_total_bytes: int = Field(262_144, ge=256, description="a Run stops adding rows past this many bytes")
    execute_value_bytes: int = Field(1 << 20, ge=1024, description="largest string/blob SQLite may build in a Run")
    executes_per_tenant: int = Field(2, ge=1, description="Runs (and their waiters: the same again) per tenant")
    type_open_timeout_s: float = Field(10.0, gt=0, description="a Type stream must send open within this")
    max_connections_per_tenant: int = Field(512, ge=1, description="WebSocket connections and gRPC Type streams "
                                            "one tenant may hold at once, at most; its share is "
                                            "twice its session share, capped by this")
    # -- data sessions (docs/api.md "Data API") --------------------------------
    redis_url: str = Field("", description="Redis of the data API: rows log, session meta, flash answers, "
                           "events (empty: $HEADSTART_REDIS_URL; neither: the data API answers UNAVAILABLE)")
    data_sessions_per_tenant: int = Field(64, ge=1, description="data sessions one tenant may hold open "
                                          "(all gateways on the same Redis together)")
    data_rows_per_push: int = Field(512, ge=1, description="rows one data push may carry")
    data_row_chars: int = Field(512, ge=16, description="longest row, as the line the model reads")
    data_chars_per_s: float = Field(50_000.0, gt=0, description="row characters per second per tenant "
                                    "(all its data sessions together)")
    data_chars_burst: int = Field(200_000, ge=1, description="row characters a tenant may push at once")
    data_queries_per_tenant: int = Field(4, ge=1, description="data queries a tenant may run at once "
                                         "(and as many waiting)")
