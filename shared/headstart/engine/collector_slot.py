"""The batch collector a step thread of a batched group reports to.

A thread-local slot with no imports of its own, so `kv.extend` can hand its
call to the group's collector (`headstart.engine.batching`) without kv and
batching importing each other.
"""

from __future__ import annotations

import threading

_current = threading.local()  # .collector and .rank on a step thread of a group


def active():
    """The collector of the group this thread's step belongs to, or None."""
    return getattr(_current, "collector", None)


def active_rank() -> tuple:
    return getattr(_current, "rank", ())


def enter(collector, rank: tuple) -> None:
    _current.collector, _current.rank = collector, rank


def leave() -> None:
    _current.collector = None
