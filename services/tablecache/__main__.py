"""`python -m services.tablecache`: run the table-cache service until SIGTERM/SIGINT.

Settings come from the environment: the engine's (`HEADSTART_MODEL`,
`HEADSTART_DTYPE`, `HEADSTART_DEVICE`, `HEADSTART_TABLE_CACHE`,
`HEADSTART_TABLE_STORE_URL`, ...) and the service's (`HEADSTART_TABLECACHE_*`).
"""

from __future__ import annotations

import logging
import signal
import threading

from headstart.config import EngineSettings
from services.tablecache.core import TableCacheCore
from services.tablecache.server import start_server
from services.tablecache.settings import TableCacheSettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = TableCacheSettings()
    engine = EngineSettings(p0_cache_on_disk=False)
    core = TableCacheCore(engine)
    running = start_server(core, settings)
    logging.getLogger("services.tablecache").info(
        "table-cache service for %s %s (%s) on %s:%d, store %s", core.model_id, core.loaded.dtype_name, core.mode,
        settings.host, running.port, core.store.url.split("@")[-1])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    running.stop()
    core.close()


if __name__ == "__main__":
    main()
