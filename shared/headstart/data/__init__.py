"""Data sessions (issue 12): a live KV cache of a schema plus the recent rows
of the session's tables, so a question costs only its own tokens.

Above the engine: a `DataSession` runs its ingestion, retention and queries
as jobs on the runtime's one forward worker (no second scheduler).

NOTE: the names below are imported on first use (PEP 562), so processes that
only need the Redis side (`headstart.data.live_store`: the gateway, the flash
worker) do not import torch and the model code with the package.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DataSession": "headstart.data.session",
    "DataSettings": "headstart.data.types",
    "FlashAnswer": "headstart.data.types",
    "PushAck": "headstart.data.types",
    "QueryResult": "headstart.data.types",
    "VersionEvent": "headstart.data.types",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
