"""Error codes of the serving API and their gRPC / HTTP statuses.

Every edge speaks the same codes: a WebSocket `{"type":"error","code":...}`,
an in-stream `Error` message of the gRPC API, a gRPC status on unary calls,
an HTTP status on REST. `ApiError` is what the Python client raises.
"""

from __future__ import annotations

import grpc

# code -> (gRPC status, HTTP status)
CODES: dict[str, tuple[grpc.StatusCode, int]] = {
    "INVALID_ARGUMENT": (grpc.StatusCode.INVALID_ARGUMENT, 400),
    "TEXT_TOO_LONG": (grpc.StatusCode.INVALID_ARGUMENT, 413),
    "PROMPT_TOO_LONG": (grpc.StatusCode.INVALID_ARGUMENT, 413),
    "MESSAGE_TOO_LARGE": (grpc.StatusCode.RESOURCE_EXHAUSTED, 413),
    "STALE_SEQUENCE": (grpc.StatusCode.FAILED_PRECONDITION, 409),
    "SESSION_CLOSED": (grpc.StatusCode.FAILED_PRECONDITION, 410),
    "SESSION_MOVED": (grpc.StatusCode.FAILED_PRECONDITION, 409),  # another connection attached to the session
    "SESSION_FAILED": (grpc.StatusCode.FAILED_PRECONDITION, 409),  # a data session whose ingestion failed
    "OUT_OF_RANGE": (grpc.StatusCode.OUT_OF_RANGE, 416),  # a resume id outside the events kept
    "NOT_FOUND": (grpc.StatusCode.NOT_FOUND, 404),
    "RESOURCE_EXHAUSTED": (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    "RATE_LIMITED": (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    # a data session's ingestion is past its lag bound: nothing of the push was kept, retry later
    "INGESTION_BEHIND": (grpc.StatusCode.UNAVAILABLE, 503),
    "CANCELLED": (grpc.StatusCode.CANCELLED, 499),
    "UNAUTHENTICATED": (grpc.StatusCode.UNAUTHENTICATED, 401),
    "UNAVAILABLE": (grpc.StatusCode.UNAVAILABLE, 503),
    "STORE_FULL": (grpc.StatusCode.RESOURCE_EXHAUSTED, 503),  # the data store is at its maxmemory: nothing was written
    "SEQS_BEHIND": (grpc.StatusCode.FAILED_PRECONDITION, 409),  # replica to gateway only (engine.errors.SeqsBehind)
    "INTERNAL": (grpc.StatusCode.INTERNAL, 500),
}
# NOTE: a gRPC status carries only the coarse status; the exact code rides in
# this trailing-metadata key so a client can tell TEXT_TOO_LONG from INVALID_ARGUMENT.
CODE_METADATA_KEY = "headstart-error-code"
# A retry hint (INGESTION_BEHIND) rides in gRPC's own server-pushback trailer (gRFC A6), in
# milliseconds; REST answers it as a Retry-After header (whole seconds, rounded up).
RETRY_METADATA_KEY = "grpc-retry-pushback-ms"


class ApiError(Exception):
    """An error a headstart server sent back, with its stable `code`."""

    def __init__(self, code: str, message: str, seq: int = 0, retry_after_s: float | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.seq = code, message, seq
        self.retry_after_s = retry_after_s  # when to try again (a backpressure refusal), else None


def retry_after_of(exc: BaseException) -> float | None:
    """The retry hint an error carries (`retry_after_s`), None when it has none."""
    value = getattr(exc, "retry_after_s", None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def retry_metadata(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The pushback trailer of an error with a retry hint (none without one)."""
    seconds = retry_after_of(exc)
    return () if seconds is None else ((RETRY_METADATA_KEY, str(max(1, round(seconds * 1000)))),)


def retry_from_metadata(trailing) -> float | None:
    """The retry hint (seconds) of a call's trailing metadata, None when absent or malformed."""
    raw = dict(trailing or ()).get(RETRY_METADATA_KEY)
    try:
        return int(raw) / 1000.0 if raw is not None else None
    except ValueError:
        return None


def grpc_status(code: str) -> grpc.StatusCode:
    return CODES.get(code, CODES["INTERNAL"])[0]


def http_status(code: str) -> int:
    return CODES.get(code, CODES["INTERNAL"])[1]


def code_of(exc: BaseException) -> str:
    """The API code of an exception (engine errors carry one; others are INTERNAL)."""
    from headstart.engine.errors import HeadstartError
    from headstart.schema import SchemaError

    if isinstance(exc, ApiError):
        return exc.code
    if isinstance(exc, HeadstartError):
        return exc.code
    if isinstance(exc, SchemaError):
        return "NOT_FOUND"
    return "INTERNAL"


def from_rpc_error(exc: grpc.RpcError) -> ApiError:
    """Turn a failed call into an ApiError, reading the exact code from trailing metadata."""
    trailing = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
    code = trailing.get(CODE_METADATA_KEY)
    if code is None:
        status = exc.code() if hasattr(exc, "code") else None
        code = next((c for c, (s, _) in CODES.items() if s == status), "INTERNAL")
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return ApiError(code, details or "", retry_after_s=retry_from_metadata(trailing.items()))


# Statuses of a stream that broke underneath us (gateway restarted, connection
# lost) when the server did not say why: a headstart refusal always carries
# CODE_METADATA_KEY, so it is never retried.
TRANSPORT_STATUSES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                                grpc.StatusCode.INTERNAL})


def is_transport_failure(exc: BaseException) -> bool:
    """True when a call failed because the connection broke, not because the server refused it."""
    if not isinstance(exc, grpc.RpcError) or not hasattr(exc, "code"):
        return False
    trailing = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
    return CODE_METADATA_KEY not in trailing and exc.code() in TRANSPORT_STATUSES
