"""`headstart serve`: the whole local stack in one command.

Starts a local Ray (temp files under the run directory, Ray's token auth on:
services/engine/ray_auth.py) or joins a running cluster (`--ray-address`), the engine
deployment behind Serve's gRPC proxy, the gateway (page, REST, WebSocket,
/metrics, public gRPC), the flash worker (`python -m services.flash`, a child
process) and the Redis that data sessions need (rows log,
versions, flash answers, events): the one at `--redis` or
$HEADSTART_REDIS_URL, else an embedded one (`redis-server` or
`valkey-server`, on a free loopback port, with an append-only file fsynced
before each reply, restarted by a watchdog if it dies) that lives as long as the
stack. A loopback URL with nothing answering there is started
too. Ctrl-C stops everything it started.
"""

from __future__ import annotations

from headstart.models.catalogue import DEFAULT_MODEL
import contextlib
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlparse

from headstart.config import EngineSettings
from services.engine.guard import configured_secret, generate_secret
from services.engine.ray_stack import (connect_ray, free_port, start_engine, start_ray, stop_engine,
                                      stop_local_engine)
from services.flash.local import start_local_worker
from services.gateway.app import GatewayServer
from services.gateway.auth import parse_token_specs
from services.gateway.settings import GatewaySettings
from services.ray_dir import ray_temp_dir

LOOPBACK = ("127.0.0.1", "localhost", "::1")
REDIS_URL_ENV = "HEADSTART_REDIS_URL"


@dataclass
class LocalStack:
    """What `serve_command(block=False)` started; `stop()` undoes it in reverse."""

    http_url: str
    grpc_target: str
    engine_target: str
    gateway: GatewayServer
    redis_url: str | None = None
    redis_server: object | None = None  # the embedded LocalRedis (None: --redis), for fault injection
    redis_watchdog: object | None = None  # what restarts it when it dies (headstart.redis_server.Watchdog)
    _exit: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def stop(self) -> None:
        self._exit.close()


def default_replica_threads(device: str, replicas: int) -> int | None:
    """torch threads per CPU replica: this machine's cores shared among them.
    Needed because Ray starts an actor that asks for no CPUs with
    OMP_NUM_THREADS=1, which would leave all but one core idle (measured on 2
    cores, 0.5B fp32: a 20-token forward 329 ms on one thread, 187 ms on two)."""
    if device.startswith("cuda"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, replicas))


def serve_command(model: str = DEFAULT_MODEL, dtype: str = "float32", host: str = "127.0.0.1", port: int = 8080,
                  grpc_port: int = 50051, replicas: int = 1, tokens: list[str] | None = None, device: str = "cpu",
                  redis_url: str | None = None, max_sessions: int = 64, threads: int | None = None,
                  table_cache: str = "off", engine_grpc_port: int | None = None, flash_worker: bool = True,
                  default_max_new_tokens: int | None = None, openai_database: str = "", block: bool = True,
                  ray_address: str | None = None, replica_resource: str | None = None,
                  say=print, on_ready: Callable[[LocalStack], None] | None = None,
                  quiet: bool = False) -> LocalStack | None:
    """Start the local stack; with `block` wait for Ctrl-C (SIGINT/SIGTERM), then stop it.

    Args:
        tokens: `TOKEN` or `TENANT=TOKEN` strings; none: no auth, loopback only.
        redis_url: a redis:// URL (default $HEADSTART_REDIS_URL); a loopback one with no server
            behind it is started here, and with neither an embedded one is started for the stack.
        table_cache: each replica's table cache (`EngineSettings.table_cache`): off | pfk | independent.
        engine_grpc_port: port of Serve's gRPC proxy (default: a free one, loopback).
        flash_worker: start the flash worker (`python -m services.flash`) as a child process;
            off for a caller that runs its own (e.g. with another answer length).
        default_max_new_tokens: the gateway's answer length when a request names none, and the
            flash worker's (None: the gateway's setting, $HEADSTART_GATEWAY_DEFAULT_MAX_NEW_TOKENS).
        openai_database: the database of an OpenAI completion that names none (empty: required).
        ray_address: join the Ray cluster whose GCS is there (host:port) instead of starting one;
            this process must run on one of its nodes (see `connect_ray`).
        replica_resource: a Ray custom resource each replica asks one unit of (a cluster whose
            nodes have one each gets one replica per node).
        on_ready: called with the stack once the gateway accepts connections (its page answers).
        quiet: Ray's and Serve's own log lines (INFO, and the shutdown warnings) off the terminal,
            for `headstart demo`: only what this stack says is printed.
    """
    token_map = parse_token_specs(tokens or [])
    if not token_map and host not in LOOPBACK:
        say(f"no --token configured: binding to 127.0.0.1 only (not {host}); pass --token to listen on {host}")
        host = "127.0.0.1"
    elif not token_map:
        say("no --token configured: no authentication, listening on loopback only")
    stack_exit = contextlib.ExitStack()
    try:
        redis_url, redis_server, watchdog = _redis(redis_url or os.environ.get(REDIS_URL_ENV), stack_exit, say)
        previous = os.environ.get(REDIS_URL_ENV)
        os.environ[REDIS_URL_ENV] = redis_url  # replicas and tools started from here inherit it
        stack_exit.callback(_restore_env, REDIS_URL_ENV, previous)
        threads = threads or default_replica_threads(device, replicas)
        per_replica = f", {threads} torch thread(s) each" if threads else ""
        if ray_address:
            say(f"joining the Ray cluster at {ray_address}; {replicas} engine replica(s) of {model}{per_replica} ...")
            if redis_server is not None:
                say(f"note: the embedded Redis listens on {redis_server.url}: replicas on other nodes reach "
                    "data sessions' store only through --redis with an address they can dial")
            connect_ray(ray_address)
        else:
            temp = ray_temp_dir()
            say(f"starting Ray (temp files in {temp.resolve()}) and {replicas} engine replica(s) of {model}"
                f"{per_replica} ...")
            ray_auth = start_ray(temp, quiet=quiet)
            stack_exit.callback(ray_auth.cleanup)  # runs after stop_engine (an ExitStack unwinds backwards)
        # a Ray of our own ends with the stack (Serve's controller with it); a joined one is left as found
        stack_exit.callback(stop_engine if ray_address else stop_local_engine)
        settings = EngineSettings(model=model, dtype=dtype, device=device, threads=threads, max_sessions=max_sessions,
                                  table_cache=table_cache, redis_url=redis_url)
        # The engine secret: $HEADSTART_ENGINE_SECRET (or its _FILE) when set, else a fresh one per start.
        secret = configured_secret() or generate_secret()
        engine = start_engine(settings, num_replicas=replicas, grpc_port=engine_grpc_port or free_port(),
                              num_gpus=1.0 if device.startswith("cuda") else 0.0, secret=secret,
                              catalogue=catalogue_config(),
                              resources={replica_resource: 1.0} if replica_resource else None)
        say(f"engine replicas ready behind Serve's gRPC proxy: engine at {engine.grpc_target}")
        gateway = GatewayServer(GatewaySettings(
            host=host, port=port, grpc_host=host, grpc_port=grpc_port, engine_target=engine.grpc_target,
            engine_app=engine.app_name, tokens=token_map, engine_secret=secret,
            engine_capacity=replicas * max_sessions, redis_url=redis_url, served_model=model,
            openai_database=openai_database,
            **({} if default_max_new_tokens is None else {"default_max_new_tokens": default_max_new_tokens}),
        )).start()
        stack_exit.callback(gateway.stop)
        if flash_worker:  # flash questions: answered after every data version, in a process of its own
            flash = start_local_worker(redis_url, engine.grpc_target, engine.app_name, secret,
                                       max_new_tokens=gateway.settings.default_max_new_tokens,
                                       log_level="WARNING" if quiet else "INFO")
            stack_exit.callback(flash.stop)
    except BaseException:
        stack_exit.close()
        raise
    shown = "localhost" if host in LOOPBACK else host
    stack = LocalStack(f"http://{shown}:{gateway.http_port}", f"{shown}:{gateway.grpc_port}", engine.grpc_target,
                       gateway, redis_url, redis_server, watchdog, stack_exit)
    say(f"headstart is up: page {stack.http_url}/  health {stack.http_url}/healthz  "
        f"gRPC {stack.grpc_target}  (Ctrl-C stops)")
    if on_ready is not None:
        on_ready(stack)
    if not block:
        return stack
    _wait_for_signal()
    say("stopping ...")
    stack.stop()
    return None


def catalogue_config() -> dict:
    """The environment's catalogue (headstart.schema.catalogue) as Catalogue keyword arguments for the replicas."""
    from headstart.schema.catalogue import Catalogue

    env = Catalogue.from_env()
    return {"sqlite_roots": [str(r) for r in env.sqlite_roots], "include_spider": env.include_spider,
            "postgres": {e.name: e.spec for e in env.entries() if e.kind == "postgres"}}


def _redis(url: str | None, stack_exit: contextlib.ExitStack, say):
    """(URL, server, watchdog) of the stack's Redis: `url` as is when a server answers there (or it
    is not loopback; no server, no watchdog); else a local server started for a loopback `url` with
    nothing behind it, or for no `url` at all, with an append-only file (fsynced before each reply:
    an acknowledged row survives a crash) and a watchdog that restarts it if it dies.

    Raises:
        RedisServerError: a server must be started and no binary is installed (the message says how).
    """
    from headstart.redis_server import Watchdog, local_redis, ping

    port = None
    if url:
        parsed = urlparse(url)
        if parsed.scheme != "redis":
            raise ValueError(f"unsupported Redis URL {url!r}: use redis://host:port/db")
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
        if host not in LOOPBACK or ping(host, port):
            return url, None, None
    server = stack_exit.enter_context(local_redis(port=port, aof=True))
    watchdog = Watchdog(server, say=say)
    stack_exit.callback(watchdog.close)  # before the server stops (an ExitStack unwinds backwards)
    say(f"started {'an embedded ' if not url else ''}redis-server on {server.url} (append-only file, "
        f"fsynced before each reply{'; --redis URL to use your own' if not url else ''})")
    return url or server.url, server, watchdog


def _restore_env(name: str, value: str | None) -> None:
    """Put an environment variable back as it was before the stack (a stopped embedded Redis is no URL)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _wait_for_signal() -> None:
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
