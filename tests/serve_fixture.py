"""A real serving stack for integration tests, started once per test session.

`serve_stack`: a local Ray (private temp dir, Ray's token auth on), Ray Serve with the
engine app (2 replicas, CPU, random:tiny in float64, at most 4 attached
sessions per replica) behind Serve's gRPC proxy, and a gateway (HTTP +
WebSocket + public gRPC on free ports) with two tenants. Both use the
session's Redis (tests/redis_fixture.py) for data sessions, as `headstart
serve` does. `make_gateway`
starts extra gateways on the same engine with other edge limits. The engine
requires its secret (the gateway sends it); its catalogue holds the Spider ids
and the SQLite files of `tenant_db_root` (`blobs`: see tests/tenant_dbs.py).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
MAX_ATTACHED = 4
NUM_REPLICAS = 2
SERVED_MODEL = "random:tiny"  # the engine's model: what the OpenAI API lists
KV_BUDGET_BYTES = 64 << 20  # per replica; far above what the tests hold (random:tiny float64: 512 bytes a token)


@dataclass
class ServeStack:
    engine_target: str
    app_name: str
    http_url: str
    ws_url: str
    grpc_target: str
    gateway: object


@dataclass(frozen=True)
class TestEngine:
    """The started engine: where, its secret, and the folder of its catalogue's SQLite files."""

    grpc_target: str
    app_name: str
    secret: str
    db_root: Path
    redis_url: str = ""
    ray_auth: object = None  # services.engine.ray_auth.RayAuth: Ray's token file

    def metadata(self, session_id: str | None = None) -> tuple[tuple[str, str], ...]:
        from services.engine.ray_stack import EngineStack

        return EngineStack(self.grpc_target, self.app_name, self.secret).metadata(session_id)


def _gateway(engine, **overrides):
    from services.gateway.app import GatewayServer
    from services.gateway.settings import GatewaySettings

    overrides = {"engine_capacity": MAX_ATTACHED * NUM_REPLICAS, "sqlite_roots": [engine.db_root],
                 "engine_secret": engine.secret, "redis_url": engine.redis_url, **overrides}
    # another engine_target: a gateway cut off from the engine; other tokens: tenants of its own
    overrides = {"engine_target": engine.grpc_target, "tokens": TOKENS, **overrides}
    overrides = {"served_model": SERVED_MODEL, **overrides}
    settings = GatewaySettings(host="127.0.0.1", port=0, grpc_port=0, engine_app=engine.app_name,
                               reconnect_timeout_s=90, **overrides)
    server = GatewayServer(settings).start()
    return server, ServeStack(engine.grpc_target, engine.app_name, f"http://127.0.0.1:{server.http_port}",
                              f"ws://127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}", server)


@contextlib.contextmanager
def own_engine_app(engine: TestEngine, app: str, settings, **gateway_settings):
    """An engine app of its own (one replica, `settings`) on the session's Ray Serve, with a gateway
    of its own (`gateway_settings`: more GatewaySettings) in front of it; yields the gateway server.
    For tests that break what an engine depends on (its Redis) without touching the shared one."""
    from ray import serve

    from services.engine.deployment import engine_app
    from services.engine.ray_stack import EngineStack, wait_ready
    from services.gateway.app import GatewayServer
    from services.gateway.settings import GatewaySettings

    serve.run(engine_app(settings, num_replicas=1, max_attached=4, secret=engine.secret),
              name=app, route_prefix="/" + app, blocking=False)
    gateway = None
    try:
        wait_ready(EngineStack(engine.grpc_target, app, engine.secret), timeout_s=300)
        gateway = GatewayServer(GatewaySettings(host="127.0.0.1", port=0, grpc_port=0, tokens=TOKENS,
                                                engine_target=engine.grpc_target, engine_app=app,
                                                engine_secret=engine.secret, **gateway_settings)).start()
        yield gateway
    finally:
        if gateway is not None:
            gateway.stop()
        serve.delete(app)


@pytest.fixture(scope="session")
def serve_engine(tmp_path_factory, redis_url):
    pytest.importorskip("ray")
    from headstart.config import EngineSettings
    from services.engine.ray_stack import start_engine, start_ray, stop_engine
    from tests.tenant_dbs import make_tenant_dbs

    ray_dir = Path(tempfile.mkdtemp(prefix="hsr", dir="/tmp"))  # short: Ray's socket paths
    ray_auth = start_ray(ray_dir, num_cpus=2)
    settings = EngineSettings(model="random:tiny", dtype="float64", threads=1, chunk_tokens=64, debounce_ms=0.0,
                              p0_cache_dir=tmp_path_factory.mktemp("serve-p0"), kv_budget_bytes=KV_BUDGET_BYTES,
                              redis_url=redis_url)
    db_root = make_tenant_dbs(tmp_path_factory.mktemp("tenant-dbs"))
    try:
        engine = start_engine(settings, num_replicas=NUM_REPLICAS, max_attached=MAX_ATTACHED,
                              catalogue={"sqlite_roots": [str(db_root)]})
        yield TestEngine(engine.grpc_target, engine.app_name, engine.secret, db_root, redis_url, ray_auth)
    finally:
        stop_engine()
        ray_auth.cleanup()
        shutil.rmtree(ray_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def serve_stack(serve_engine):
    server, stack = _gateway(serve_engine)
    yield stack
    server.stop()


@pytest.fixture
def make_gateway(serve_engine):
    servers = []

    def make(**overrides) -> ServeStack:
        server, stack = _gateway(serve_engine, **overrides)
        servers.append(server)
        return stack

    yield make
    for server in servers:
        server.stop()
