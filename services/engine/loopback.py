"""Keep the local stack's Serve ports on loopback.

Ray Serve binds its gRPC proxy and each replica's inter-deployment gRPC server
to `[::]` (all interfaces) with no option to change it. The local stack
(`headstart serve`, the tests) installs `bind_serve_to_loopback` as Ray's
`worker_process_setup_hook`, so in every worker of the job (the Serve
controller, proxy and replicas) those servers bind to HEADSTART_ENGINE_BIND_HOST
(default 127.0.0.1) instead. A deployment across machines (the Helm chart)
does not use it: there the engine secret and the NetworkPolicy guard the port.
"""

from __future__ import annotations

import os

BIND_HOST_ENV = "HEADSTART_ENGINE_BIND_HOST"
SETUP_HOOK = "services.engine.loopback.bind_serve_to_loopback"
ALL_INTERFACES = "[::]"


def _rebind(address: str, host: str) -> str:
    if address.startswith(ALL_INTERFACES + ":"):
        return (f"[{host}]" if ":" in host else host) + address[len(ALL_INTERFACES):]
    return address


def bind_serve_to_loopback() -> None:
    """Patch Serve's two `[::]` binds in this worker process (a Ray worker setup hook)."""
    host = os.environ.get(BIND_HOST_ENV, "127.0.0.1")
    if host in ("", "0.0.0.0", "::"):
        return
    from ray.serve._private import default_impl, replica

    add_grpc_address = default_impl.add_grpc_address
    add_port = replica.add_port_to_grpc_server
    default_impl.add_grpc_address = lambda server, address: add_grpc_address(server, _rebind(address, host))
    replica.add_port_to_grpc_server = lambda server, address: add_port(server, _rebind(address, host))
