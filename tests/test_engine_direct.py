"""The replica's direct ingress (services/engine/direct.py) and the gateway's side of it
(services/gateway/engine_direct.py, EngineLink's choice of path), on real gRPC servers
with scripted handlers. The real stack's direct streams: tests/test_serve_direct.py."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from headstart.v1 import engine_pb2, engine_pb2_grpc
from services.engine.direct import (ADVERTISE_ENV, ENABLED_ENV, HOST_ENV, PORTS_ENV, DirectConfigError,
                                    DirectIngress, DirectSettings, advertised_host, parse_ports,
                                    start_direct_ingress)
from services.gateway.engine_direct import DirectChannels
from services.gateway.engine_link import EngineLink


@pytest.mark.parametrize("text, ports", [("0", (0, 0)), ("9100", (9100, 9100)), (" 9100-9115 ", (9100, 9115))])
def test_ports_parse(text, ports):
    assert parse_ports(text) == ports


@pytest.mark.parametrize("text", ["", "x", "9100-", "9115-9100", "0-5", "70000", "-3", "9100-9115-9120"])
def test_bad_ports_name_the_variable(text):
    with pytest.raises(DirectConfigError, match=PORTS_ENV):
        parse_ports(text)


def test_settings_from_env():
    assert DirectSettings.from_env({}) == DirectSettings()
    s = DirectSettings.from_env({ENABLED_ENV: "off", HOST_ENV: "0.0.0.0", PORTS_ENV: "9100-9101",
                                 ADVERTISE_ENV: "pod-1.engine"})
    assert s == DirectSettings(False, "0.0.0.0", (9100, 9101), "pod-1.engine")
    with pytest.raises(DirectConfigError, match=ENABLED_ENV):
        DirectSettings.from_env({ENABLED_ENV: "maybe"})


def test_advertised_host():
    assert advertised_host(DirectSettings(host="127.0.0.1")) == "127.0.0.1"
    assert advertised_host(DirectSettings(host="0.0.0.0", advertise="engine-0")) == "engine-0"
    wildcard = advertised_host(DirectSettings(host="0.0.0.0"))
    assert wildcard and wildcard != "0.0.0.0"  # an address another machine can dial


def _echo_handler(seen: list):
    """Answers attach with `attached` naming the call's tenant metadata, and each snapshot with an ack."""
    async def handler(requests, metadata):
        seen.append(dict(metadata))
        async for request in requests:
            if request.WhichOneof("kind") == "attach":
                yield engine_pb2.EngineEvent(attached=engine_pb2.Attached(replica=dict(metadata).get("who", "")))
            else:
                yield engine_pb2.EngineEvent(ack=engine_pb2.Ack(seq=request.snapshot.seq, replica="r"))
    return handler


def _session_call(target: str, requests: list[engine_pb2.EngineRequest], metadata=()):
    with grpc.insecure_channel(target) as channel:
        return list(engine_pb2_grpc.EngineStub(channel).Session(iter(requests), metadata=metadata, timeout=10))


def test_ingress_serves_sessions_with_their_metadata_and_nothing_else():
    seen: list = []
    ingress = DirectIngress(_echo_handler(seen), DirectSettings())
    target = ingress.start()
    try:
        assert target == f"127.0.0.1:{ingress.port}" and ingress.port > 0
        events = _session_call(target, [engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="s")),
                                        engine_pb2.EngineRequest(snapshot=engine_pb2.Snapshot(seq=3, text="How"))],
                               metadata=(("who", "alice"),))
        assert [e.WhichOneof("kind") for e in events] == ["attached", "ack"]
        assert events[0].attached.replica == "alice" and events[1].ack.seq == 3
        assert seen[0]["who"] == "alice"
        with grpc.insecure_channel(target) as channel:  # every other RPC stays on Serve's proxy
            with pytest.raises(grpc.RpcError) as err:
                engine_pb2_grpc.EngineStub(channel).Describe(engine_pb2.EngineSessionRef(session_id="s"), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        ingress.stop()
    assert not ingress._thread.is_alive()
    with pytest.raises(grpc.RpcError) as err:
        _session_call(target, [engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="s"))])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_stop_ends_open_streams():
    async def handler(requests, metadata):
        async for _ in requests:
            yield engine_pb2.EngineEvent(attached=engine_pb2.Attached(replica="r"))

    ingress = DirectIngress(handler, DirectSettings())
    target = ingress.start()
    channel = grpc.insecure_channel(target)
    try:
        pending: list = []
        call = engine_pb2_grpc.EngineStub(channel).Session(iter(_blocking(pending)), timeout=30)
        assert next(call).WhichOneof("kind") == "attached"
        ingress.stop()
        with pytest.raises(grpc.RpcError) as err:
            next(call)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    finally:
        pending.append(None)
        channel.close()


def _blocking(pending: list):
    """One attach, then block until the test ends (a stream the client keeps open)."""
    import time

    yield engine_pb2.EngineRequest(attach=engine_pb2.Attach(session_id="s"))
    while not pending:
        time.sleep(0.01)


def test_a_port_range_takes_the_first_free_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if port >= 65535:
            pytest.skip("no room for a range above the taken port")
        ingress = DirectIngress(_echo_handler([]), DirectSettings(ports=(port, port + 1)))
        try:
            assert ingress.start() == f"127.0.0.1:{port + 1}"
        except OSError:
            pytest.skip(f"port {port + 1} is taken by another process")
        finally:
            ingress.stop()


def test_no_free_port_leaves_sessions_on_the_proxy(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=PORTS_ENV):
            DirectIngress(_echo_handler([]), DirectSettings(ports=(port, port))).start()
        assert start_direct_ingress(_echo_handler([]), DirectSettings(ports=(port, port))) is None
    assert "through Serve's proxy" in caplog.text
    assert start_direct_ingress(_echo_handler([]), DirectSettings(enabled=False)) is None


# -- the gateway's side ------------------------------------------------------


class _Call:
    """A scripted `Session` call: answers attach with `attached`, then waits for the end."""

    def __init__(self, replica: str, fail: grpc.aio.AioRpcError | None = None):
        self.replica, self.fail, self.writes, self.cancelled = replica, fail, [], False
        self._answered = False

    async def write(self, request):
        if self.fail is not None:
            raise self.fail
        self.writes.append(request)

    async def read(self):
        if not self._answered:
            self._answered = True
            return engine_pb2.EngineEvent(attached=engine_pb2.Attached(replica=self.replica))
        while not self.cancelled:
            await asyncio.sleep(0.01)
        return grpc.aio.EOF

    def cancel(self):
        self.cancelled = True


class _Stub:
    def __init__(self, replica: str, target: str = "", locate_error: grpc.aio.AioRpcError | None = None,
                 session_error: grpc.aio.AioRpcError | None = None):
        self.replica, self.target = replica, target
        self.locate_error, self.session_error = locate_error, session_error
        self.calls: list[_Call] = []
        self.locates = 0

    def Session(self, metadata=()):  # noqa: N802
        self.calls.append(_Call(self.replica, self.session_error))
        return self.calls[-1]

    async def Locate(self, request, metadata=(), timeout=None):  # noqa: N802
        self.locates += 1
        if self.locate_error is not None:
            raise self.locate_error
        return engine_pb2.EngineLocation(replica=self.replica, direct_target=self.target)


class _Channels(DirectChannels):
    """DirectChannels whose stubs are scripted (one per target)."""

    def __init__(self, stubs: dict[str, _Stub], enabled: bool = True):
        super().__init__(enabled)
        self.stubs = stubs

    async def connect(self, target):
        return self.stubs[target]


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="scripted")


def _open(proxy: _Stub, channels: DirectChannels | None) -> EngineLink:
    link = EngineLink(proxy, "app", "sid", "world_1", "headstart", lambda: (0, ""), on_event=lambda e: None,
                      direct=channels)

    async def go():
        await link.start()
        await link.close()
        if channels is not None:
            await channels.close()

    asyncio.run(go())
    return link


def test_a_located_replica_takes_the_stream_directly():
    direct = _Stub("replica-a")
    proxy = _Stub("replica-a", target="10.0.0.7:9100")
    channels = _Channels({"10.0.0.7:9100": direct})
    link = _open(proxy, channels)
    assert link.path == "direct" and link.replica == "replica-a"
    assert len(direct.calls) == 1 and proxy.calls == [] and proxy.locates == 1
    assert direct.calls[0].writes[0].attach.session_id == "sid"
    assert channels.opened_by_path == {"direct": 1, "proxy": 0}


@pytest.mark.parametrize("proxy_kwargs", [
    {"target": ""},  # the replica serves no direct port
    {"locate_error": _rpc_error(grpc.StatusCode.UNIMPLEMENTED)},  # an engine without Locate
])
def test_no_address_goes_through_the_proxy(proxy_kwargs):
    proxy = _Stub("replica-a", **proxy_kwargs)
    channels = _Channels({})
    link = _open(proxy, channels)
    assert link.path == "proxy" and len(proxy.calls) == 1
    assert channels.opened_by_path == {"direct": 0, "proxy": 1}


def test_off_asks_no_locate():
    proxy = _Stub("replica-a", target="10.0.0.7:9100")
    link = _open(proxy, _Channels({}, enabled=False))
    assert link.path == "proxy" and proxy.locates == 0


def test_a_failed_address_falls_back_to_the_proxy_and_is_passed_over():
    direct = _Stub("replica-a", session_error=_rpc_error(grpc.StatusCode.UNAVAILABLE))
    proxy = _Stub("replica-a", target="10.0.0.7:9100")
    channels = _Channels({"10.0.0.7:9100": direct})
    link = _open(proxy, channels)
    assert link.path == "proxy" and len(proxy.calls) == 1
    assert direct.calls[0].cancelled, "the failed direct call is not left open"
    link = _open(proxy, channels)  # within BAD_TARGET_S: straight to the proxy
    assert link.path == "proxy" and len(direct.calls) == 1 and len(proxy.calls) == 2
    assert channels.opened_by_path == {"direct": 0, "proxy": 2}


def test_an_unconnectable_address_falls_back_within_the_connect_timeout(monkeypatch):
    """A real channel to an address that never connects (a firewall that drops, here an
    unroutable TEST-NET address): the stream goes through the proxy after CONNECT_TIMEOUT_S."""
    import services.gateway.engine_direct as engine_direct

    monkeypatch.setattr(engine_direct, "CONNECT_TIMEOUT_S", 0.2)
    proxy = _Stub("replica-a", target="192.0.2.1:9100")
    channels = DirectChannels()
    link = _open(proxy, channels)
    assert link.path == "proxy" and len(proxy.calls) == 1
    assert channels.opened_by_path == {"direct": 0, "proxy": 1}
