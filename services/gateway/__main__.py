"""`python -m services.gateway`: run the gateway alone (a Kubernetes pod) until SIGTERM/SIGINT.

Settings come from the environment (`HEADSTART_GATEWAY_*`, see settings.py):
the chart sets them from a ConfigMap, and the tenant tokens
(`HEADSTART_GATEWAY_TOKENS`, JSON token -> tenant) from a Secret.
"""

from __future__ import annotations

import logging
import signal
import threading

from services.gateway.app import GatewayServer
from services.gateway.settings import GatewaySettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = GatewaySettings()
    if not settings.tokens:
        logging.getLogger("services.gateway").warning("no tenant tokens configured: no authentication")
    server = GatewayServer(settings).start()
    logging.getLogger("services.gateway").info("gateway on %s:%d (HTTP) and %s:%d (gRPC), engine %s",
                                               settings.host, server.http_port, settings.grpc_host,
                                               server.grpc_port, settings.engine_target)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
