"""Run a local Redis (or Valkey) server: for the tests and for `headstart serve`.

`local_redis()` starts `redis-server` (or `valkey-server`) bound to 127.0.0.1
on a free port, in a scratch directory; waits until it answers PING; yields a
`LocalRedis` (its `url` is `redis://127.0.0.1:PORT/0`) and stops it on exit.
Without persistence by default (a cache, the tests); with `aof=True` it keeps
an append-only file in its directory, written and fsynced before each reply
(`appendfsync always`), so a restart of the server (a crash of its process, or
of the machine) loses no write it acknowledged: the data API's promise
(headstart serve's embedded Redis, the chart's). `everysec` would not keep it:
while a background fsync is slow, Redis 7.0 postpones writing its buffer (up
to 2 s) yet still replies, and a crash then loses acknowledged writes; Redis
7.0 has no WAITAOF to wait for the fsync instead. The binary is taken from
$HEADSTART_REDIS_SERVER, else the first of `redis-server`, `valkey-server` on PATH.

    with local_redis() as server:
        store = open_store(server.url)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from headstart.processes import stop_process

BINARIES = ("redis-server", "valkey-server")
ENV_BINARY = "HEADSTART_REDIS_SERVER"
HOST = "127.0.0.1"
APPENDFSYNC = "always"  # a reply implies its write is on disk (module docstring)
APPENDFSYNC_POLICIES = ("always", "everysec", "no")


class RedisServerError(RuntimeError):
    """No server binary, or the server did not start."""


def find_redis_binary() -> str:
    """Path of the server binary ($HEADSTART_REDIS_SERVER, redis-server, valkey-server).

    Raises:
        RedisServerError: none found (the message says how to get one).
    """
    env = os.environ.get(ENV_BINARY)
    if env:
        if shutil.which(env) is None:
            raise RedisServerError(f"${ENV_BINARY}={env!r} is not an executable")
        return env
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    raise RedisServerError(
        f"none of {list(BINARIES)} is on PATH: install redis-server (apt-get install redis-server) "
        f"or valkey, or set ${ENV_BINARY} to a server binary"
    )


def free_port(host: str = HOST) -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ping(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when a Redis server at host:port answers PING (raw RESP, no client needed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class LocalRedis:
    """One local server process; `stop()` and `start()` may be called again (same port)."""

    def __init__(
        self, binary: str, port: int, dir: Path, *, host: str = HOST, extra_args: Sequence[str] = (),
        aof: bool = False, appendfsync: str = APPENDFSYNC,
    ) -> None:
        if appendfsync not in APPENDFSYNC_POLICIES:
            raise ValueError(f"appendfsync must be one of {list(APPENDFSYNC_POLICIES)}, got {appendfsync!r}")
        self.binary = binary
        self.host = host
        self.port = port
        self.dir = dir
        self.extra_args = tuple(extra_args)
        self.aof, self.appendfsync = aof, appendfsync
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it answers PING.

        Raises:
            RedisServerError: it exited or did not answer within `timeout_s`.
        """
        if self.is_running:
            return
        persistence = ["--appendonly", "yes", "--appendfsync", self.appendfsync] if self.aof else ["--appendonly", "no"]
        args = [
            self.binary, "--port", str(self.port), "--bind", self.host,
            "--save", "", *persistence, "--dir", str(self.dir), "--daemonize", "no",
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + timeout_s
        # NOTE: another server may already hold the port and answer PING, so
        # only a server reporting our process id counts as started.
        while not (ping(self.host, self.port) and self._answering_pid() == self.process.pid):
            if self.process.poll() is not None:
                raise RedisServerError(f"{self.binary} exited with {self.process.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RedisServerError(f"{self.binary} did not answer PING in {timeout_s}s: {self._log_tail()}")
            time.sleep(0.02)  # polling an external process, not synchronising threads

    def _answering_pid(self) -> int | None:
        """process_id of the server answering on our port (None when unreadable)."""
        import redis  # the client is a dependency of headstart; imported late, used only here

        try:
            with redis.Redis(host=self.host, port=self.port, socket_timeout=0.5) as client:
                return int(client.info("server")["process_id"])
        except (redis.RedisError, KeyError, ValueError):
            return None

    def kill(self) -> None:
        """End the server at once (SIGKILL: a crash, no shutdown work); `start()` brings it back."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait()
        self.process = None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate the server (kill after `timeout_s`); no-op when not running."""
        if self.process is None:
            return
        stop_process(self.process, timeout_s)
        self.process = None

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"


@contextmanager
def local_redis(
    port: int | None = None,
    dir: str | Path | None = None,
    *,
    binary: str | None = None,
    host: str = HOST,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 10.0,
    aof: bool = False,
    appendfsync: str = APPENDFSYNC,
) -> Iterator[LocalRedis]:
    """A running local server for the duration of the block (see module docstring).

    Args:
        port: fixed port; by default a free one (retried when another process
            grabs it first).
        dir: working directory (logs); a temporary one, removed after, by default.
        binary: server binary; default `find_redis_binary()`.
        host: address to bind and to put in `url` (127.0.0.1).
        extra_args: more server options, e.g. `["--maxmemory", "4gb",
            "--maxmemory-policy", "allkeys-lru"]` (an evicted block is a miss;
            `RedisStore.clean_orphans` tidies the index).
        aof: keep an append-only file (fsynced before each reply) in `dir`:
            acknowledged writes survive a restart of the server.
        appendfsync: the file's fsync policy ("always"; "everysec" only to measure what
            "always" costs: it may lose acknowledged writes).
    """
    binary = binary or find_redis_binary()
    with tempfile.TemporaryDirectory(prefix="headstart-redis-") as tmp:
        workdir = Path(dir) if dir is not None else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        server = _start(binary, port, workdir, host, extra_args, startup_timeout_s, aof, appendfsync)
        try:
            yield server
        finally:
            server.stop()


def _start(
    binary: str, port: int | None, workdir: Path, host: str, extra_args: Sequence[str], timeout_s: float,
    aof: bool = False, appendfsync: str = APPENDFSYNC,
) -> LocalRedis:
    """Start on `port`, or on a free port (3 tries: another process may take it first)."""
    attempts = 1 if port is not None else 3
    for attempt in range(attempts):
        chosen = port if port is not None else free_port(host)
        server = LocalRedis(binary, chosen, workdir, host=host, extra_args=extra_args, aof=aof,
                            appendfsync=appendfsync)
        try:
            server.start(timeout_s)
            return server
        except RedisServerError:
            if attempt == attempts - 1:
                raise
    raise RedisServerError("unreachable")  # the loop returns or raises


class Watchdog:
    """Starts a `LocalRedis` again, on its port and with its files, when its process ends (a crash):
    with `aof=True` nothing it acknowledged is lost. `headstart serve` watches its embedded Redis.

    `paused()` holds it off while a caller keeps the server down on purpose (a fault injection).
    """

    def __init__(self, server: LocalRedis, period_s: float = 1.0, say=print):
        import threading

        self.server, self.period_s, self.say = server, period_s, say
        self.restarts = 0
        self._stop, self._held = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._run, name="headstart-redis-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with self._held:
                if self._stop.is_set() or self.server.is_running:
                    continue
                try:
                    self.server.start()
                except RedisServerError as exc:
                    self.say(f"redis-server on {self.server.url} did not restart: {exc}")
                    continue
                self.restarts += 1
                self.say(f"redis-server on {self.server.url} had stopped: restarted from its append-only file")

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._held:
            yield

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

