"""Session streams straight into the replica: Serve routes them, its proxy does not carry them.

Through Serve's gRPC proxy every message of a bidi stream is Ray actor work:
each request message is a `receive_grpc_messages` call from the replica to
the proxy, each event an object-ref item back. With 40 keystrokes a second
(8 typists) that took about a quarter of a 2-core machine from the forwards
(docs/benchmarks-archive.md, "Session streams past Serve's proxy"). So each replica
also serves `Engine.Session` on a gRPC port of its own. Serve still decides
where a session lives: the gateway asks `Locate` through the proxy (sticky by
`session_id`, like every call of the session) and opens the stream at the
address the replica answers (services/gateway/engine_direct.py). The port
checks the engine secret exactly as the proxy path does.

Settings (the replica's environment):

- `HEADSTART_ENGINE_DIRECT`: `on` (default) or `off` (Locate answers no
  address; every stream goes through the proxy).
- `HEADSTART_ENGINE_DIRECT_HOST`: the bind address (default 127.0.0.1; the
  Helm chart binds 0.0.0.0).
- `HEADSTART_ENGINE_DIRECT_PORTS`: `0` (a free port, default), a port, or a
  range `9100-9115` (the first free one: several replicas in one pod).
- `HEADSTART_ENGINE_DIRECT_ADVERTISE`: the host the gateway dials (default:
  the bind host; for a wildcard bind, the node's IP as Ray knows it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import grpc

from headstart.v1 import engine_pb2, engine_pb2_grpc

log = logging.getLogger(__name__)

ENABLED_ENV = "HEADSTART_ENGINE_DIRECT"
HOST_ENV = "HEADSTART_ENGINE_DIRECT_HOST"
PORTS_ENV = "HEADSTART_ENGINE_DIRECT_PORTS"
ADVERTISE_ENV = "HEADSTART_ENGINE_DIRECT_ADVERTISE"
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")
START_TIMEOUT_S = 30.0

# (requests, call metadata) -> events: the deployment's Session handler
SessionHandler = Callable[[AsyncIterator[engine_pb2.EngineRequest], list[tuple[str, str]]],
                          AsyncIterator[engine_pb2.EngineEvent]]


class DirectConfigError(ValueError):
    """A direct-ingress setting that cannot be used (the message names the variable)."""


@dataclass(frozen=True)
class DirectSettings:
    """Where a replica serves its sessions directly (see the module docstring)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    ports: tuple[int, int] = (0, 0)  # first and last port to try; (0, 0): any free port
    advertise: str = ""  # "": the bind host, or the node's IP for a wildcard bind

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "DirectSettings":
        """Raises DirectConfigError on a value it cannot use."""
        enabled = env.get(ENABLED_ENV, "on").strip().lower()
        if enabled not in ("on", "off", "1", "0", "true", "false"):
            raise DirectConfigError(f"{ENABLED_ENV}={enabled!r}: use on or off")
        return cls(enabled=enabled in ("on", "1", "true"), host=env.get(HOST_ENV, "127.0.0.1").strip(),
                   ports=parse_ports(env.get(PORTS_ENV, "0")), advertise=env.get(ADVERTISE_ENV, "").strip())


def parse_ports(text: str) -> tuple[int, int]:
    """`0`, `9100` or `9100-9115` as (first, last); raises DirectConfigError."""
    text = text.strip()
    first, sep, last = text.partition("-")
    try:
        lo, hi = int(first), int(last) if sep else int(first)
    except ValueError:
        raise DirectConfigError(f"{PORTS_ENV}={text!r}: give 0, a port or a range such as 9100-9115") from None
    if not (0 <= lo <= hi <= 65535) or (lo == 0 and hi != 0):
        raise DirectConfigError(f"{PORTS_ENV}={text!r}: ports must be 1-65535 with first <= last (or 0)")
    return lo, hi


def advertised_host(settings: DirectSettings) -> str:
    """The host the gateway dials for this replica."""
    if settings.advertise:
        return settings.advertise
    if settings.host not in WILDCARD_HOSTS:
        return settings.host
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # not in a Ray worker (a unit test): this machine's name
        return socket.gethostbyname(socket.gethostname())


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class _DirectServicer(engine_pb2_grpc.EngineServicer):
    """Only `Session`; every other RPC stays on the proxy (UNIMPLEMENTED here)."""

    def __init__(self, handler: SessionHandler):
        self._handler = handler

    async def Session(self, request_iterator, context):  # noqa: N802 (the RPC's name)
        # aclosing: a call the gateway cancels closes the handler at once (its session detaches)
        async with contextlib.aclosing(self._handler(request_iterator, list(context.invocation_metadata()))) as events:
            async for event in events:
                yield event


class DirectIngress:
    """A gRPC server for `Engine.Session` on a thread and event loop of its own.

    Its own loop: a stream's events are written as they come, whatever Serve's
    loops are busy with; the session code it runs is the same as on the proxy
    path (thread-safe core, per-stream asyncio objects)."""

    def __init__(self, handler: SessionHandler, settings: DirectSettings):
        self.settings = settings
        self._handler = handler
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self.port = 0
        self.target = ""

    def start(self) -> str:
        """Bind and serve; returns the advertised `host:port`.

        Raises:
            OSError: no port of the configured range could be bound.
        """
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="headstart-direct", daemon=True)
        self._thread.start()
        self.port = ready.result(timeout=START_TIMEOUT_S)
        self.target = _target(advertised_host(self.settings), self.port)
        return self.target

    def stop(self, grace_s: float = 1.0) -> None:
        """End every stream (the gateway reattaches through Locate) and the thread."""
        loop, stop = self._loop, self._stop
        if loop is None or stop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(stop.set)
        except RuntimeError:  # the loop already ended
            return
        if self._thread is not None:
            self._thread.join(timeout=grace_s + 5.0)

    def _run(self, ready: concurrent.futures.Future) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve(ready))
        except BaseException as exc:  # bind failure: start() raises it
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.exception("direct ingress stopped")
        finally:
            loop.close()

    async def _serve(self, ready: concurrent.futures.Future) -> None:
        self._stop = asyncio.Event()
        server = grpc.aio.server()
        engine_pb2_grpc.add_EngineServicer_to_server(_DirectServicer(self._handler), server)
        port = _bind(server, self.settings.host, self.settings.ports)
        await server.start()
        ready.set_result(port)
        try:
            await self._stop.wait()
        finally:
            await server.stop(1.0)


def _bind(server: grpc.aio.Server, host: str, ports: tuple[int, int]) -> int:
    """The first port of `ports` that binds on `host` (grpc returns 0 or raises when one is taken)."""
    lo, hi = ports
    for port in range(lo, hi + 1):
        try:
            bound = server.add_insecure_port(_target(host, port))
        except RuntimeError:
            bound = 0
        if bound:
            return bound
    raise OSError(f"direct ingress: no free port in {lo}-{hi} on {host} ({PORTS_ENV})")


def start_direct_ingress(handler: SessionHandler, settings: DirectSettings | None = None) -> DirectIngress | None:
    """The replica's direct ingress, serving; None when it is off or cannot bind
    (then every stream goes through the proxy, which still works: logged).

    Raises:
        DirectConfigError: a setting cannot be used.
    """
    settings = settings or DirectSettings.from_env()
    if not settings.enabled:
        return None
    ingress = DirectIngress(handler, settings)
    try:
        target = ingress.start()
    except OSError as exc:
        log.error("%s; sessions go through Serve's proxy", exc)
        return None
    log.info("direct ingress for sessions at %s", target)
    return ingress
