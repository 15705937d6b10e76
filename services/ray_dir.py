"""Where Ray writes its temp files: under the project's run directory.

Ray puts unix sockets under its temp dir and their paths must stay under
~107 characters, so when `run_dir()/ray` is too long we point Ray at a short
symlink in /tmp that leads there: the files still live in the run directory.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from headstart.paths import run_dir

MAX_TEMP_DIR_CHARS = 40


def ray_temp_dir() -> Path:
    """A short path for Ray's `_temp_dir` whose files land in `run_dir()/ray`."""
    target = run_dir() / "ray"
    target.mkdir(parents=True, exist_ok=True)
    if len(str(target)) <= MAX_TEMP_DIR_CHARS:
        return target
    digest = hashlib.sha256(str(target).encode()).hexdigest()[:10]
    link = Path("/tmp") / f"hs-ray-{os.getuid()}-{digest}"
    if link.is_symlink() and Path(os.readlink(link)) != target:
        link.unlink()
    if not link.exists():
        link.symlink_to(target, target_is_directory=True)
    return link
