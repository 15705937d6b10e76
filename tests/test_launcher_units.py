"""The local stack's defaults that need no Ray to check."""

from __future__ import annotations

import os
import time

from services.launcher import default_replica_threads


def test_cpu_replicas_share_the_cores_and_cuda_ones_keep_torch_defaults(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    assert default_replica_threads("cpu", 1) == 4
    assert default_replica_threads("cpu", 2) == 2
    assert default_replica_threads("cpu", 3) == 1
    assert default_replica_threads("cpu", 8) == 1  # never zero
    assert default_replica_threads("cuda", 1) is None
    assert default_replica_threads("cuda:1", 2) is None


def test_serve_starts_an_embedded_redis_when_none_is_configured_and_stops_it_with_the_stack():
    import contextlib
    from urllib.parse import urlparse

    import pytest

    from headstart.redis_server import RedisServerError, find_redis_binary, ping
    from services.launcher import _redis

    try:
        find_redis_binary()
    except RedisServerError as exc:
        pytest.skip(f"no Redis server binary: {exc}")
    said = []
    with contextlib.ExitStack() as stack:
        url, server, watchdog = _redis(None, stack, said.append)
        where = urlparse(url)
        assert where.hostname == "127.0.0.1" and ping(where.hostname, where.port)
        assert "embedded" in said[0] and "append-only" in said[0]
        assert _redis(url, stack, said.append) == (url, None, None) and len(said) == 1  # answering: used as is
        # issue 29: the data API's promise. A crash of the server (SIGKILL) loses no acknowledged
        # write, and the watchdog brings it back on its port from its append-only file.
        import redis

        client = redis.Redis.from_url(url)
        client.set("acked", "yes")
        server.kill()
        end = time.monotonic() + 30
        while watchdog.restarts == 0:
            assert time.monotonic() < end, "the watchdog did not restart Redis"
            time.sleep(0.1)
        assert client.get("acked") == b"yes" and client.config_get("appendfsync") == {"appendfsync": "always"}
        client.close()
    assert not ping(where.hostname, where.port)  # it lived as long as the stack
