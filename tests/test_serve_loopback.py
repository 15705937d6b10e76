"""Integration (issue 16): the local stack listens on loopback only.

The real stack of tests/serve_fixture.py (Ray started by `start_ray`, Serve's
gRPC and HTTP proxies and the engine replicas by `start_engine`, a gateway)
runs in this test process and its children: Ray's GCS, raylet, dashboard
agent, runtime-env agent, log monitor, the Serve controller, proxy and
replica workers. Every socket any of them listens on (TCP in LISTEN, UDP
bound without a peer) must be bound to 127.0.0.1 or ::1, so nothing on
another machine can reach the engine port, Ray's ports or a dashboard.
"""

from __future__ import annotations

import ipaddress
import os

import grpc
import pytest

from headstart.v1 import engine_pb2, engine_pb2_grpc

pytestmark = pytest.mark.slow

psutil = pytest.importorskip("psutil")


def _stack_pids() -> dict[int, str]:
    """This process and all its descendants (Ray's daemons and workers), by name."""
    me = psutil.Process(os.getpid())
    pids = {me.pid: me.name()}
    for child in me.children(recursive=True):
        try:
            pids[child.pid] = " ".join(child.cmdline()[:3]) or child.name()
        except psutil.Error:  # exited meanwhile
            continue
    return pids


def _listeners(pids: dict[int, str]) -> list[tuple[str, int, str]]:
    """(ip, port, process) of every listening TCP socket and every bound, unconnected UDP socket."""
    found = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid not in pids or not conn.laddr:
            continue
        listening = conn.status == psutil.CONN_LISTEN if conn.type == 1 else not conn.raddr  # 1: SOCK_STREAM
        if listening:
            found.append((conn.laddr.ip, conn.laddr.port, pids[conn.pid]))
    return found


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's view of 127.0.0.1
    return (mapped or address).is_loopback


def test_every_listener_of_the_stack_is_on_loopback(serve_stack, serve_engine):
    # The proxy and both replicas must be up and have served a call (Serve
    # starts a replica's gRPC server lazily in some versions).
    with grpc.insecure_channel(serve_engine.grpc_target) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        for i in range(8):
            stub.Describe(engine_pb2.EngineSessionRef(), metadata=serve_engine.metadata(f"lo-{i}"), timeout=30)
    pids = _stack_pids()
    listeners = _listeners(pids)
    ports = {port for _, port, _ in listeners}
    # The sockets we know of are among them: the engine's gRPC proxy and the gateway's two ports.
    engine_port = int(serve_engine.grpc_target.rsplit(":", 1)[1])
    gateway_ports = {int(serve_stack.http_url.rsplit(":", 1)[1]), int(serve_stack.grpc_target.rsplit(":", 1)[1])}
    assert {engine_port} | gateway_ports <= ports, (engine_port, gateway_ports, sorted(ports))
    assert any("raylet" in name for _, _, name in listeners), "Ray's raylet was not found among the listeners"
    exposed = [(ip, port, name) for ip, port, name in listeners if not _is_loopback(ip)]
    assert not exposed, f"listening beyond loopback: {exposed}"
