"""Start a local Ray (or join a running cluster) + Serve with the engine app behind Serve's gRPC proxy.

Used by `headstart serve` and by the integration tests (one start per test
session). Ray's temp files go under a short folder (Ray's unix socket paths
must stay under ~107 characters), auth is off (local, loopback).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headstart.config import EngineSettings
from services.engine.deployment import APP_NAME, SERVICER_FUNCTIONS, engine_app
from services.engine.guard import SECRET_METADATA_KEY, configured_secret, generate_secret
from services.engine.loopback import SETUP_HOOK
from services.engine.ray_auth import RayAuth, enable_token_auth


@dataclass(frozen=True)
class EngineStack:
    grpc_target: str  # host:port of Serve's gRPC proxy
    app_name: str = APP_NAME
    secret: str = field(default="", repr=False)  # what every call must carry (SECRET_METADATA_KEY)

    def metadata(self, session_id: str | None = None) -> tuple[tuple[str, str], ...]:
        """Metadata of a call to the engine: app, secret and (for routing) the session id."""
        md = (("application", self.app_name), (SECRET_METADATA_KEY, self.secret))
        return md + ((("session_id", session_id),) if session_id is not None else ())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# Ray's own switch for "this machine only": with it off, Ray takes 127.0.0.1
# as the node's address instead of the machine's reachable one (it ignores a
# loopback `_node_ip_address`, see ray._private.services.resolve_ip_for_localhost),
# and its C++ servers (GCS, raylet, every worker's core worker) and agents then
# listen on loopback only. Read at import by ray._private.ray_constants.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def keep_ray_on_loopback() -> None:
    """Make the Ray this process starts (and its children) a loopback-only, one-node cluster."""
    os.environ[LOCAL_ONLY_ENV] = "0"
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # ray may have been imported before the variable was set


# Ray's raylet starts every worker process at niceness 15 (its `worker_niceness`
# config, read from this variable): an engine replica, the process holding the
# model and every session, would then yield the CPU to any normal-priority
# process on its node (the gateway, the flash worker, a neighbour) and its data
# sessions fell behind their pushes under load. The replica is the serving
# work, so it runs at the priority of the process that started Ray.
WORKER_NICENESS_ENV = "RAY_worker_niceness"
WORKER_NICENESS = "0"


def keep_worker_priority() -> None:
    """Ray workers (engine replicas) this process starts run at niceness 0, not Ray's 15
    (an operator's own $RAY_worker_niceness is kept)."""
    os.environ.setdefault(WORKER_NICENESS_ENV, WORKER_NICENESS)


@contextmanager
def dashboard_agent_port(port: int) -> Iterator[None]:
    """Within: a Ray node this process starts gives its dashboard agent's HTTP
    server `port` instead of Ray's fixed default (52365).

    ray.init has no argument for it, and two clusters on one machine (a test
    worker's and a `headstart loadtest` stack's, or two users' stacks) would
    race for 52365: the loser's agent, the one that refuses jobs without Ray's
    token, does not listen at all. ray.init builds its `RayParams` from the
    module attribute at call time, so a subclass with another default is seen
    (ray[serve] is pinned; tests/test_serve_ray_auth.py finds the agent on
    its port and would fail were this ignored).
    """
    from ray._private import parameter

    original = parameter.RayParams

    class _Params(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("dashboard_agent_listen_port", port)
            super().__init__(*args, **kwargs)

    parameter.RayParams = _Params
    try:
        yield
    finally:
        parameter.RayParams = original


def start_ray(temp_dir: Path, num_cpus: int | None = None, quiet: bool = False) -> RayAuth:
    """ray.init on this machine with a private temp dir, no dashboard and token auth on; `quiet`:
    Ray's and Serve's INFO lines off this process's terminal (warnings still print).

    Returns the auth token's file: call its `cleanup()` after `stop_engine()`.
    """
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not sys.stdout.isatty():  # the lines Ray prints for its processes: no raw color codes in a file or pipe
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    # Serve kills a proxy that misses its ready check (5 s) three times in a row, and
    # serve.start then fails ("Proxy actor reported not ready"): on a 2-core machine busy
    # with forwards a proxy's first start takes longer. Ray's processes inherit these.
    for name in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        os.environ.setdefault(name, "30")
    keep_worker_priority()
    keep_ray_on_loopback()
    temp_dir.mkdir(parents=True, exist_ok=True)
    if len(str(temp_dir)) > 60:
        raise ValueError(f"Ray temp dir {temp_dir} is too long for unix socket paths (keep it under 60 chars)")
    # NOTE: keep_ray_on_loopback (above) is what keeps Ray's own ports (GCS,
    # raylet, object manager, workers, agents, dashboard process) on loopback:
    # a local stack has no other node to reach. Alone, _node_ip_address=127.0.0.1
    # is turned into the machine's address by Ray. The setup hook does the same
    # for Serve's gRPC servers (services/engine/loopback.py);
    # tests/test_serve_loopback.py checks every listening socket.
    auth = enable_token_auth()
    try:
        with dashboard_agent_port(free_port()):
            ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=str(temp_dir),
                     ignore_reinit_error=True, log_to_driver=False, _node_ip_address="127.0.0.1",
                     runtime_env={"worker_process_setup_hook": SETUP_HOOK},
                     logging_level=logging.WARNING if quiet else logging.INFO)
    except BaseException:
        auth.cleanup()
        raise
    if quiet:  # Serve's driver-side logger ("Started Serve", "Application ... is ready")
        from ray.serve._private.constants import SERVE_LOGGER_NAME

        logging.getLogger(SERVE_LOGGER_NAME).setLevel(logging.WARNING)
    return auth


def connect_ray(address: str) -> None:
    """ray.init into an existing cluster at `address` (its GCS, host:port) instead of starting one.

    The cluster's own settings hold: its nodes' addresses (not forced onto
    loopback) and its auth (a cluster with token auth: $RAY_AUTH_MODE=token
    and $RAY_AUTH_TOKEN_PATH in this environment, as for any Ray client). This
    process must run on one of its nodes: Serve's gRPC proxy that the gateway
    dials is the one on this node, at the node's HEADSTART_ENGINE_BIND_HOST
    (127.0.0.1 unless the node sets another)."""
    import ray

    from services.engine.ray_auth import MODE_ENV, _reload_ray_config

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if os.environ.get(MODE_ENV) == "token":
        _reload_ray_config()  # Ray may be imported already, its config cached before the variables
    ray.init(address=address, log_to_driver=False, ignore_reinit_error=True,
             runtime_env={"worker_process_setup_hook": SETUP_HOOK})


def start_engine(settings: EngineSettings, num_replicas: int = 2, grpc_port: int | None = None,
                 max_attached: int | None = None, num_cpus: float = 0.0, num_gpus: float = 0.0,
                 host: str = "127.0.0.1", secret: str | None = None,
                 catalogue: dict[str, Any] | None = None, resources: dict[str, float] | None = None) -> EngineStack:
    """Start Serve (gRPC proxy on `grpc_port`, HTTP proxy on a free loopback
    port) and deploy the engine app; blocks until the replicas are ready.

    `secret`: the engine secret (default: $HEADSTART_ENGINE_SECRET, else a
    fresh one); `catalogue`: Catalogue keyword arguments (default: the
    environment's, see headstart.schema.catalogue); `resources`: Ray custom
    resources each replica asks for (e.g. one unit of a resource every node
    has once: one replica per node)."""
    from ray import serve
    from ray.serve.config import gRPCOptions

    grpc_port = grpc_port or free_port(host)
    serve.start(
        http_options={"host": "127.0.0.1", "port": free_port()},
        grpc_options=gRPCOptions(port=grpc_port, grpc_servicer_functions=SERVICER_FUNCTIONS),
    )
    secret = configured_secret(secret) or generate_secret()
    app = engine_app(settings, num_replicas, max_attached, num_cpus, num_gpus, secret, catalogue, resources)
    serve.run(app, name=APP_NAME, route_prefix="/" + APP_NAME, blocking=False)
    stack = EngineStack(f"{host}:{grpc_port}", secret=secret)
    # replicas load their weights side by side on a small machine: a minute each
    wait_ready(stack, timeout_s=60.0 * max(1, num_replicas), replicas=num_replicas)
    return stack


def wait_ready(stack: EngineStack, timeout_s: float = 60.0, replicas: int = 1) -> None:
    """Poll the proxy until it routes to the app and to `replicas` distinct replicas.

    The proxy's route table and its router's replica set both lag `serve.run`
    (and a replica's replacement): a router that knows one replica of two sends
    every session there, and when it learns of the second, consistent hashing
    moves about half of the sessions to it. Waiting until calls for different
    session ids reach `replicas` replicas keeps the first sessions where they open.
    """
    import grpc

    from headstart.v1 import engine_pb2, engine_pb2_grpc

    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    probe = 0
    with grpc.insecure_channel(stack.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        while True:
            probe += 1
            try:
                info = stub.Describe(engine_pb2.EngineSessionRef(),
                                     metadata=stack.metadata(f"readiness-probe-{probe}"), timeout=5)
                seen.add(info.replica)
                if len(seen) >= replicas:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the proxy at {stack.grpc_target} routed to {len(seen)} of "
                                       f"{replicas} replicas in {timeout_s:.0f} s")
                if probe % 16 == 0:
                    time.sleep(0.25)  # the router has not heard of the others yet
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"engine app not reachable at {stack.grpc_target}: {exc}") from exc
                time.sleep(0.25)


def stop_engine() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def stop_local_engine(app_name: str = APP_NAME) -> None:
    """`stop_engine` for a Ray this process started (`start_ray`): the application deleted (its
    replicas shut down as `serve.shutdown` shuts them down), then Ray, which ends Serve's controller
    and proxies with its processes.

    NOTE: not `serve.shutdown`: Serve's controller kills itself inside the `graceful_shutdown` task
    it is answering, and the driver prints that task's failure ("(raylet) Task
    ServeController.graceful_shutdown failed ... killed by `ray.kill`") at every stop."""
    import ray
    from ray import serve

    try:
        serve.delete(app_name)
    finally:
        ray.shutdown()
