"""A real Redis server for tests: `redis_url` (session) and `redis_restartable` (per test).

With env HEADSTART_TEST_REDIS_URL set, that server is used as is for
`redis_url` (tests write only under fresh, uuid-named scopes there).
Otherwise `redis-server` (or `valkey-server`, or $HEADSTART_REDIS_SERVER) is
started on a free 127.0.0.1 port with `--save "" --appendonly no` in a
temporary folder, through `headstart.redis_server.local_redis`, and stopped at
the end of the session.

`slow_fsync_binary()` is scripts/redis_server_slow_fsync.sh: a redis-server whose every fsync
takes 1.5 s (strace's fault injection), for the durability tests.

`redis_restartable` starts a second, private server for one test, which the
test may `stop()` and `start()` again on the same port (fallback tests).

Tests are skipped only when no server binary can be found; any other failure
to start fails them, with the server's log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from headstart.redis_server import LocalRedis, RedisServerError, find_redis_binary, local_redis

URL_ENV = "HEADSTART_TEST_REDIS_URL"
SLOW_FSYNC_WRAPPER = Path(__file__).resolve().parent.parent / "scripts" / "redis_server_slow_fsync.sh"


def redis_binary_or_skip() -> str:
    """The server binary (`find_redis_binary`), or skip the calling test when none is installed."""
    try:
        return find_redis_binary()
    except RedisServerError as exc:
        pytest.skip(f"no Redis server binary: {exc}")


def slow_fsync_binary() -> str:
    """The slow-fsync wrapper of redis-server; skips when strace is missing or may not trace here."""
    redis_binary_or_skip()
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace): the slow-fsync fault needs it")
    probe = subprocess.run(["strace", "-qq", "-o", "/dev/null", "-e", "trace=fdatasync", "true"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"strace may not trace here: {probe.stderr.decode(errors='replace')[:200]}")
    return str(SLOW_FSYNC_WRAPPER)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """`redis://127.0.0.1:PORT/0` of a server running for the whole session."""
    env = os.environ.get(URL_ENV)
    if env:
        yield env
        return
    with local_redis(binary=redis_binary_or_skip()) as server:
        yield server.url


@pytest.fixture
def redis_restartable(tmp_path) -> Iterator[LocalRedis]:
    """A private server for one test; `stop()` / `start()` it at will."""
    with local_redis(dir=tmp_path, binary=redis_binary_or_skip()) as server:
        yield server
