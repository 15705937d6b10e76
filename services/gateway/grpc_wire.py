"""Turn bad bytes on the public gRPC port into typed errors instead of silent ends.

gRPC itself answers a message over the receive limit with a bare
RESOURCE_EXHAUSTED (no `headstart-error-code` trailer), and a message it
cannot parse (a `string` field of invalid UTF-8) by ending the call. We
register the Headstart service with deserializers that never raise: a message
over `max_message_bytes` becomes `TooLarge`, unparsable bytes become
`Malformed`, and the servicer answers each with its typed error (in-stream
for Type, a status with the trailer for unary calls). The transport limit is
raised to WIRE_CEILING so that the servicer, not gRPC, sees oversize messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc

from headstart.client.errors import ApiError
from headstart.v1 import headstart_pb2_grpc, types_pb2

WIRE_CEILING = 1 << 20  # what gRPC itself still refuses (bare RESOURCE_EXHAUSTED)


@dataclass(frozen=True)
class TooLarge:
    num_bytes: int
    limit: int

    def error(self) -> ApiError:
        return ApiError("MESSAGE_TOO_LARGE", f"message of {self.num_bytes} bytes; the limit is {self.limit}")


@dataclass(frozen=True)
class Malformed:
    reason: str

    def error(self) -> ApiError:
        return ApiError("INVALID_ARGUMENT", f"malformed message: {self.reason}")


MAX_TEMPERATURE = 2.0  # as the OpenAI edge takes it


def sampling_of(params: types_pb2.SamplingParams) -> types_pb2.SamplingParams:
    """A gRPC request's temperature, top_p and seed, checked: INVALID_ARGUMENT naming the one out of
    range, NaN and infinities included (they were taken and ignored). proto3's 0 is "unset":
    greedy, top_p 1. `max_new_tokens` is left out (GatewayService.params checks it)."""
    if not math.isfinite(params.temperature) or not 0.0 <= params.temperature <= MAX_TEMPERATURE:
        raise ApiError("INVALID_ARGUMENT", f"temperature must be a number in [0, {MAX_TEMPERATURE:g}], "
                                           f"not {params.temperature!r}")
    if not math.isfinite(params.top_p) or not 0.0 <= params.top_p <= 1.0:
        raise ApiError("INVALID_ARGUMENT", f"top_p must be a number in (0, 1] (0: unset), not {params.top_p!r}")
    return types_pb2.SamplingParams(temperature=params.temperature, top_p=params.top_p, seed=params.seed)


def checked(message):
    """`message`, or raise the ApiError of a TooLarge / Malformed stand-in."""
    if isinstance(message, (TooLarge, Malformed)):
        raise message.error()
    return message


def _safe(deserialize, limit: int):
    def parse(data: bytes):
        if len(data) > limit:
            return TooLarge(len(data), limit)
        try:
            return deserialize(data)
        except Exception as exc:  # DecodeError: invalid UTF-8 in a string field, truncated bytes
            return Malformed(type(exc).__name__ + (": invalid UTF-8 in a string field" if "utf-8" in
                                                   str(exc).lower() else ""))
    return parse


class _Capture:
    """Stands in for a server to collect what a generated add_*_to_server registers."""

    def __init__(self):
        self.name, self.handlers = "", {}

    def add_generic_rpc_handlers(self, handlers):
        pass

    def add_registered_method_handlers(self, name, handlers):
        self.name, self.handlers = name, handlers


def add_headstart_servicer(servicer, server: grpc.aio.Server, limit: int) -> None:
    """Register `servicer` like add_HeadstartServicer_to_server, with never-raising deserializers."""
    capture = _Capture()
    headstart_pb2_grpc.add_HeadstartServicer_to_server(servicer, capture)
    handlers = {name: h._replace(request_deserializer=_safe(h.request_deserializer, limit))
                for name, h in capture.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.name, handlers),))
    server.add_registered_method_handlers(capture.name, handlers)
