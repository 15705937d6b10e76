"""The flash worker of `headstart serve`: `python -m services.flash` as a child process.

The local stack runs it as the deployment does, as its own process (a crash
there does not take the gateway down, and a restart resumes its pending
entries under the same consumer name). Settings go through the environment;
the engine secret goes through a file only this user can read
(`HEADSTART_ENGINE_SECRET_FILE`, services/private_dir.py): never the command
line (`ps` shows it to everyone) nor the environment (issue 29: a job another
account ran through Ray read it there).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from headstart.processes import stop_process
from services.engine.guard import SECRET_ENV, SECRET_FILE_ENV
from services.private_dir import PrivateDir

ROOT = Path(__file__).resolve().parents[2]


class LocalFlashWorker:
    """A running `python -m services.flash`; `stop()` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, process: subprocess.Popen, private: PrivateDir):
        self.process = process
        self._private = private

    @property
    def is_running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_process(self.process, timeout_s)
        self._private.cleanup()


def start_local_worker(redis_url: str, engine_target: str, engine_app: str, secret: str,
                       consumer: str = "local", prefix: str = "hs", max_new_tokens: int = 128,
                       log_level: str = "INFO") -> LocalFlashWorker:
    """Start the worker against the local stack's Redis and engine (health on a free loopback port).

    `max_new_tokens`: the gateway's default answer length, so a query that names
    none is answered from Redis with the text the model would give it. `log_level`: its logging's.
    """
    private = PrivateDir("hs-flash-")
    hidden = (SECRET_ENV, "HEADSTART_FLASH_ENGINE_SECRET")  # a secret of the caller's environment stays there
    env = {**{k: v for k, v in os.environ.items() if k not in hidden},
           "HEADSTART_REDIS_URL": redis_url, "HEADSTART_FLASH_REDIS_PREFIX": prefix,
           "HEADSTART_FLASH_MAX_NEW_TOKENS": str(max_new_tokens),
           "HEADSTART_FLASH_ENGINE_TARGET": engine_target,
           "HEADSTART_FLASH_ENGINE_APP": engine_app, SECRET_FILE_ENV: str(private.write("engine-secret", secret)),
           "HEADSTART_FLASH_CONSUMER": consumer, "HEADSTART_FLASH_HEALTH_HOST": "127.0.0.1",
           "HEADSTART_FLASH_HEALTH_PORT": "0", "HEADSTART_FLASH_LOG_LEVEL": log_level}
    paths = [str(ROOT / "shared"), str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    try:
        process = subprocess.Popen([sys.executable, "-m", "services.flash"], cwd=ROOT, env=env)
    except BaseException:
        private.cleanup()
        raise
    return LocalFlashWorker(process, private)
