"""Child processes the stack starts itself (an embedded Redis, the local flash worker)."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    """End `process`: SIGTERM, then SIGKILL if it has not exited within
    `timeout_s`; a no-op when it has already exited."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
