"""The gateway's side of direct session streams (services/engine/direct.py).

A session's link asks `Locate` through Serve's proxy (routed like every call
of the session) and opens `Session` at the replica's own port. One channel
per replica address, shared by every session there. An address that does not
answer is passed over for `BAD_TARGET_S`, during which its sessions go through
the proxy: slower, never unavailable. So is one not connected within
`CONNECT_TIMEOUT_S` (an attach itself may take long: a schema to load).
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from headstart.v1 import engine_pb2, engine_pb2_grpc

log = logging.getLogger(__name__)

LOCATE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0  # a direct address not connected by then: the proxy takes the stream
BAD_TARGET_S = 30.0
MAX_CHANNELS = 256  # replicas a gateway talks to directly; the oldest channel goes past that


class DirectChannels:
    """Channels to replicas' direct ports (call on the gateway's serving loop)."""

    def __init__(self, enabled: bool = True, streams_counter=None):
        self.enabled = enabled
        self._channels: dict[str, tuple[grpc.aio.Channel, engine_pb2_grpc.EngineStub]] = {}
        self._bad_until: dict[str, float] = {}
        self._streams = streams_counter  # a Prometheus counter labelled by path, or None
        self.opened_by_path = {"direct": 0, "proxy": 0}

    def opened(self, path: str) -> None:
        """Count a stream opened `direct`ly or through the `proxy` (off, no address, a failed address)."""
        self.opened_by_path[path] += 1
        if self._streams is not None:
            self._streams.labels(path=path).inc()

    async def locate(self, proxy_stub, session_id: str, metadata) -> str:
        """The direct address of the replica Serve routes `session_id` to ("" for the proxy path)."""
        if not self.enabled:
            return ""
        try:
            where = await proxy_stub.Locate(engine_pb2.EngineSessionRef(session_id=session_id), metadata=metadata,
                                            timeout=LOCATE_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:  # an engine without Locate, or a replica going away
            log.debug("Locate of %s failed (%s): through the proxy", session_id, exc.code())
            return ""
        target = where.direct_target
        if target and self._bad_until.get(target, 0.0) > time.monotonic():
            return ""
        return target

    async def connect(self, target: str) -> engine_pb2_grpc.EngineStub:
        """The stub of `target` once its channel is connected.

        Raises:
            asyncio.TimeoutError: not connected within CONNECT_TIMEOUT_S (an address this
                gateway cannot reach: a firewall that drops, a replica gone).
        """
        channel, stub = self._entry(target)
        await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
        return stub

    def _entry(self, target: str) -> tuple[grpc.aio.Channel, engine_pb2_grpc.EngineStub]:
        entry = self._channels.get(target)
        if entry is None:
            if len(self._channels) >= MAX_CHANNELS:
                old, (channel, _) = next(iter(self._channels.items()))
                del self._channels[old]
                asyncio.ensure_future(channel.close())  # streams still on it end; their links reattach
            channel = grpc.aio.insecure_channel(target)
            entry = self._channels[target] = (channel, engine_pb2_grpc.EngineStub(channel))
        return entry

    def failed(self, target: str, error: BaseException) -> None:
        """`target` did not take a stream: the proxy carries its sessions for a while."""
        log.warning("direct engine address %s failed (%s); its sessions go through the proxy for %g s",
                    target, error, BAD_TARGET_S)
        now = time.monotonic()
        self._bad_until = {t: until for t, until in self._bad_until.items() if until > now}  # replicas come and go
        self._bad_until[target] = now + BAD_TARGET_S

    async def close(self) -> None:
        for channel, _ in self._channels.values():
            await channel.close()
        self._channels.clear()
