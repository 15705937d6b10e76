"""`headstart.redis_server`: start, restart and stop a local redis-server."""

from __future__ import annotations

import pytest

from headstart.redis_server import RedisServerError, find_redis_binary, local_redis, ping


def test_local_redis_starts_restarts_and_stops(tmp_path):
    try:
        find_redis_binary()
    except RedisServerError as exc:
        pytest.skip(str(exc))
    with local_redis(dir=tmp_path) as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0" and ping(server.host, server.port)
        server.stop()
        assert not server.is_running and not ping(server.host, server.port)
        server.start()
        assert ping(server.host, server.port)
    assert not ping(server.host, server.port)
    assert (tmp_path / "redis.log").exists()


def test_missing_binary_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HEADSTART_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(RedisServerError, match="HEADSTART_REDIS_SERVER"):
        find_redis_binary()
    monkeypatch.delenv("HEADSTART_REDIS_SERVER")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RedisServerError, match=r"none of \['redis-server', 'valkey-server'\]"):
        find_redis_binary()


def test_a_server_that_cannot_start_reports_its_log(tmp_path):
    try:
        binary = find_redis_binary()
    except RedisServerError as exc:
        pytest.skip(str(exc))
    with local_redis(dir=tmp_path / "a") as first:
        with pytest.raises(RedisServerError, match="exited"):
            with local_redis(port=first.port, dir=tmp_path / "b", binary=binary):
                pass


def test_extra_args_reach_the_server(tmp_path):
    import redis

    try:
        find_redis_binary()
    except RedisServerError as exc:
        pytest.skip(str(exc))
    with local_redis(dir=tmp_path, extra_args=["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        with redis.Redis.from_url(server.url) as client:
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}
