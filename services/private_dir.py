"""Secrets the local stack hands to its own processes as files only this user may read.

A secret in a process's environment is readable by any code that runs as
that user (`/proc/PID/environ`), and the command line by everyone (`ps`). The
local stack instead writes each secret (Ray's auth token, the engine secret
for the flash worker) into a fresh directory of mode 0700, as a file of mode
0600, and passes its *path*; `cleanup()` removes them when the stack stops.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class PrivateDir:
    """A 0700 temp directory (under /tmp: Ray's temp dir may be shared) for 0600 secret files."""

    def __init__(self, prefix: str = "hs-secrets-"):
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getuid()}-"))  # mkdtemp: mode 0700

    def write(self, name: str, text: str) -> Path:
        """Write `text` to a new file `name` of mode 0600 (created so, never widened) and return its path."""
        path = self.path / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
