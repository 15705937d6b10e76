"""Flash worker configuration: one pydantic object built at the edge (env, tests)."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REDIS_URL_ENV = "HEADSTART_REDIS_URL"


class FlashSettings(BaseSettings):
    """The worker's settings (env prefix `HEADSTART_FLASH_`).

    The Redis URL falls back to `HEADSTART_REDIS_URL` (the one the replicas
    publish versions to) and the engine secret to the engine's own variables
    (`services/engine/guard.py`), as for the gateway.
    """

    model_config = SettingsConfigDict(env_prefix="HEADSTART_FLASH_", extra="forbid")

    redis_url: str = Field("", description="Redis of the data sessions' live state (empty: $HEADSTART_REDIS_URL)")
    redis_prefix: str = Field("hs", description="key prefix of the live state (the gateway's and replicas')")
    engine_target: str = Field("127.0.0.1:9000", description="host:port of Serve's gRPC proxy")
    engine_app: str = Field("headstart-engine", description="Serve application name of the engine")
    engine_secret: str = Field("", repr=False, description="sent to the engine on every call "
                               "(empty: $HEADSTART_ENGINE_SECRET or the file in $HEADSTART_ENGINE_SECRET_FILE)")
    consumer: str = Field("", description="consumer name in the `flash` group (empty: the host name); "
                          "a restarted worker under the same name resumes its pending entries at once")
    max_new_tokens: int = Field(128, ge=1, description="answer tokens per flash question (keep it the gateway's "
                                "default_max_new_tokens: a query that names none then gets the same text)")
    evaluate_timeout_s: float = Field(60.0, gt=0, description="deadline of one DataEvaluate call")
    batch: int = Field(16, ge=1, description="version entries read at once")
    claim_idle_ms: int = Field(60_000, ge=0, description="entries another worker left pending this long "
                               "are taken over")
    retry_idle_ms: int = Field(5_000, ge=0, description="an entry whose session no replica holds yet "
                               "is retried after this long")
    max_attempts: int = Field(5, ge=1, description="tries of one entry before it is acknowledged unanswered")
    max_answer_rows: int = Field(100, ge=0, description="result rows kept per stored answer")
    # Each evaluation runs at FLASH, ahead of every person's request: a session
    # whose rows arrive in many small versions (1-2 a second in issue 14's mixed
    # run) kept the 0.5B replica answering flash questions half the time.
    min_interval_ms: int = Field(1000, ge=0, description="one session's flash questions are evaluated at most "
                                 "once per this long; versions that come meanwhile are answered together (0: each "
                                 "version at once)")
    # A version published while its replica still had acknowledged pushes waiting is superseded
    # within a forward or two; evaluating it (at FLASH, ahead of that ingestion) kept a session
    # behind its producer for good (issue 45).
    max_coalesce_ms: int = Field(5000, ge=0, description="a version with acknowledged pushes behind it is left "
                                 "to the newer one on its way, unless the session's questions have waited this "
                                 "long (0: every version answered)")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="the worker's log level (the demo's stack: WARNING, only what needs a look)")
    health_host: str = Field("0.0.0.0", description="bind address of /healthz and /metrics")
    health_port: int = Field(8090, ge=0, description="port of /healthz and /metrics (0: any free port)")

    def resolved_redis_url(self) -> str:
        """`redis_url`, else $HEADSTART_REDIS_URL; raises ValueError when neither is set."""
        url = self.redis_url or os.environ.get(REDIS_URL_ENV, "")
        if not url:
            raise ValueError(f"the flash worker needs Redis: set HEADSTART_FLASH_REDIS_URL or {REDIS_URL_ENV}")
        return url

    def consumer_name(self) -> str:
        """`consumer`, else the host name (a Deployment pod's name)."""
        return self.consumer or socket.gethostname()
