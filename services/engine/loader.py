"""Schema loads off the serving threads: bounded, single-flight, with a deadline.

Opening a session or a Complete on a database the replica has not loaded yet
reads its schema (a SQLite file, or a PostgreSQL server that may not answer).
Those reads run on a small pool of their own, at most one per database at a
time, so a slow database holds one thread and the callers that wait for it,
never the threads every other attach needs. A caller gives up after
`timeout_s` with UNAVAILABLE; the message names the catalogue name only (the
detail, password scrubbed, goes to the replica's log).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import traceback
from typing import Callable

from headstart.engine.errors import HeadstartError

log = logging.getLogger(__name__)
DEFAULT_LOAD_TIMEOUT_S = 20.0
DEFAULT_LOAD_WORKERS = 4


class DatabaseUnavailable(HeadstartError):
    """A registered database that could not be loaded (in time)."""

    code = "UNAVAILABLE"


class SchemaLoader:
    """`await ensure(spec, name)` returns once `load(spec)` has succeeded once."""

    def __init__(self, load: Callable[[str], object], timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
                 max_workers: int = DEFAULT_LOAD_WORKERS):
        self._load = load
        self.timeout_s = timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="headstart-schema")
        self._futures: dict[str, concurrent.futures.Future] = {}
        self._lock = threading.Lock()

    async def ensure(self, spec: str, name: str) -> None:
        """Load `spec` (or join the load already running).

        Raises:
            DatabaseUnavailable: the load failed or took longer than `timeout_s`.
        """
        with self._lock:
            future = self._futures.get(spec)
            if future is None or (future.done() and future.exception() is not None):
                future = self._futures[spec] = self._pool.submit(self._load, spec)
        try:
            # shield: a caller that gives up must not cancel the load others wait on.
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            raise DatabaseUnavailable(f"database {name!r} did not load within {self.timeout_s:g} s") from None
        except HeadstartError:
            raise
        except Exception as exc:
            from headstart.schema.dsn import scrub_password

            # the type and the frames, not the traceback's text: an exception's message may hold a DSN's password
            frames = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
            log.warning("database %r failed to load: %s: %s\n%s", name, type(exc).__qualname__,
                        scrub_password(str(exc), spec), frames)
            raise DatabaseUnavailable(f"database {name!r} cannot be loaded (see the engine log)") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
