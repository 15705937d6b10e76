"""The flash worker of `headstart serve`: `python -m services.flash` as a child process.

The local stack runs it as the deployment does, as its own process (a crash
there does not take the gateway down, and a restart resumes its pending
entries under the same consumer name). Settings go through the environment;
the engine secret too, never the command line (`ps` shows that).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from headstart.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]


class LocalFlashWorker:
    """A running `python -m services.flash`; `stop()` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    @property
    def is_running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_process(self.process, timeout_s)


def start_local_worker(redis_url: str, engine_target: str, engine_app: str, secret: str,
                       consumer: str = "local", prefix: str = "hs", max_new_tokens: int = 128) -> LocalFlashWorker:
    """Start the worker against the local stack's Redis and engine (health on a free loopback port).

    `max_new_tokens`: the gateway's default answer length, so a query that names
    none is answered from Redis with the text the model would give it.
    """
    env = {**os.environ, "HEADSTART_REDIS_URL": redis_url, "HEADSTART_FLASH_REDIS_PREFIX": prefix,
           "HEADSTART_FLASH_MAX_NEW_TOKENS": str(max_new_tokens),
           "HEADSTART_FLASH_ENGINE_TARGET": engine_target,
           "HEADSTART_FLASH_ENGINE_APP": engine_app, "HEADSTART_FLASH_ENGINE_SECRET": secret,
           "HEADSTART_FLASH_CONSUMER": consumer, "HEADSTART_FLASH_HEALTH_HOST": "127.0.0.1",
           "HEADSTART_FLASH_HEALTH_PORT": "0"}
    paths = [str(ROOT / "shared"), str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    process = subprocess.Popen([sys.executable, "-m", "services.flash"], cwd=ROOT, env=env)
    return LocalFlashWorker(process)
