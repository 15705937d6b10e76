"""Ray's token authentication for the local stack (`headstart serve`, the tests).

Ray's node agents serve HTTP on loopback (the job agent at
`/api/job_agent/jobs/`, the runtime-env agent), and Ray's own gRPC servers
(GCS, raylet, workers) take calls from any local process. With Ray's auth
off, any account on the machine could submit a job there and run code as
the stack's user (issue 29: it read the engine secret from the flash
worker's environment). With `RAY_AUTH_MODE=token` every one of those
servers refuses a call without the cluster's token (HTTP 401/403, gRPC
UNAUTHENTICATED).

The token is fresh per start, written to a 0600 file in a 0700 directory
(`services/private_dir.py`) and named by `RAY_AUTH_TOKEN_PATH`: Ray's
processes inherit the path, never the token itself. Ray reads both
variables when it loads its config, so they are set before `ray.init` and
the config of this process is reloaded (Ray may be imported already).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from services.private_dir import PrivateDir

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
TOKEN_ENV = "RAY_AUTH_TOKEN"


@dataclass(frozen=True)
class RayAuth:
    """The token file of a started Ray; `cleanup()` removes it (after `ray.shutdown`)."""

    token_path: Path
    private: PrivateDir

    def header(self) -> dict[str, str]:
        """The HTTP header an authorised client of Ray's HTTP servers sends (tests, tools)."""
        return {"Authorization": "Bearer " + self.token_path.read_text().strip()}

    def cleanup(self) -> None:
        self.private.cleanup()


def enable_token_auth() -> RayAuth:
    """Turn Ray's token auth on for the Ray this process starts (and its children); a fresh token."""
    private = PrivateDir("hs-ray-auth-")
    path = private.write("ray-auth-token", secrets.token_hex(32))
    os.environ[MODE_ENV] = "token"
    os.environ[TOKEN_PATH_ENV] = str(path)
    os.environ.pop(TOKEN_ENV, None)  # NOTE: Ray prefers the variable to the file; ours is the file
    _reload_ray_config()
    return RayAuth(path, private)


def _reload_ray_config() -> None:
    """Make this process's Ray see the variables (its config and token are cached at first use)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
