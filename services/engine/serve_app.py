"""The engine's Serve application builder, for a Serve config file (KubeRay's serveConfigV2).

    applications:
      - name: headstart-engine
        import_path: services.engine.serve_app:build_app
        args: {settings: {model: ..., dtype: bfloat16, device: cuda, ...}, max_attached: 64}

`args.settings` are `EngineSettings` fields; a field left out comes from the
replica's environment (`HEADSTART_*`), which is how secrets such as the Redis
URL (`HEADSTART_TABLE_STORE_URL`, from a Kubernetes Secret) reach a replica
without appearing in the config. The config's `deployments` entry may
override the replica count, resources and the request router.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from headstart.config import EngineSettings
from services.engine.deployment import engine_app

IMPORT_PATH = "services.engine.serve_app:build_app"


class EngineAppArgs(BaseModel):
    """The `args` of the application in a Serve config (unknown keys are rejected)."""

    model_config = ConfigDict(extra="forbid")

    settings: dict[str, Any] = Field(default_factory=dict, description="EngineSettings fields")
    num_replicas: int = Field(1, ge=1, description="replicas unless the config's deployments entry says otherwise")
    max_attached: int | None = Field(None, ge=1, description="attached sessions per replica (default max_sessions)")
    num_gpus: float = Field(0.0, ge=0)
    num_cpus: float = Field(0.0, ge=0)


def build_app(args: dict[str, Any]):
    """Serve calls this with the config's `args` and deploys what it returns."""
    parsed = EngineAppArgs(**args)
    settings = EngineSettings(**parsed.settings)
    return engine_app(settings, num_replicas=parsed.num_replicas, max_attached=parsed.max_attached,
                      num_cpus=parsed.num_cpus, num_gpus=parsed.num_gpus)
