"""Where headstart finds the read-only data that sits beside a checkout.

A checkout has `../shared` beside it (tokenizer, Spider/BIRD data). Every
default here can be overridden by configuration; nothing here touches the
network.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_root() -> Path:
    """The read-only `shared/` folder beside the repository (env HEADSTART_SHARED)."""
    env = os.environ.get("HEADSTART_SHARED")
    return Path(env) if env else REPO_ROOT.parent / "shared"


def default_tokenizer_dir() -> Path:
    env = os.environ.get("HEADSTART_TOKENIZER")
    return Path(env) if env else shared_data_root() / "models" / "qwen2.5-coder-tokenizer"


def default_spider_dir() -> Path:
    env = os.environ.get("HEADSTART_SPIDER_DIR")
    return Path(env) if env else shared_data_root() / "data" / "spider"


def default_bird_dir() -> Path:
    env = os.environ.get("HEADSTART_BIRD_DIR")
    return Path(env) if env else shared_data_root() / "data" / "bird"


def run_dir() -> Path:
    """Where headstart writes caches, Ray temp files and logs (env HEADSTART_HOME)."""
    env = os.environ.get("HEADSTART_HOME")
    path = Path(env) if env else REPO_ROOT / ".headstart"
    path.mkdir(parents=True, exist_ok=True)
    return path
