"""Typed errors of the engine. Each carries a `code` that every edge maps to
its own status (gRPC status, WebSocket error code, HTTP status)."""

from __future__ import annotations


class HeadstartError(Exception):
    """Base of every error a client may see. `code` is stable and machine-readable."""

    code = "INTERNAL"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(HeadstartError):
    """Malformed input: invalid UTF-8, wrong types, bad parameters."""

    code = "INVALID_ARGUMENT"


class TextTooLong(InvalidInput):
    code = "TEXT_TOO_LONG"


class PromptTooLong(InvalidInput):
    code = "PROMPT_TOO_LONG"


class StaleSequence(InvalidInput):
    """A submit whose `seq` is older than a snapshot already accepted."""

    code = "STALE_SEQUENCE"


class SeqsBehind(InvalidInput):
    """A data push whose first sequence number is not above `last_seq`, the newest the session has
    seen. Behind the gateway this means the store that numbered the rows lost writes the replica
    had taken (a Redis restarted without the tail of its file): the gateway renumbers the push
    above `last_seq` and sends it again; the client never sees this code."""

    code = "SEQS_BEHIND"

    def __init__(self, message: str, last_seq: int):
        super().__init__(message)
        self.last_seq = last_seq


# The replica's newest seq rides in this trailing-metadata key beside a SEQS_BEHIND status.
LAST_SEQ_METADATA_KEY = "headstart-last-seq"


class SessionClosed(HeadstartError):
    code = "SESSION_CLOSED"


class SessionFailed(HeadstartError):
    """A data session whose ingestion failed: it takes no more rows or questions; close it
    (its `describe()` and its `session_failed` event say why)."""

    code = "SESSION_FAILED"


class SessionNotFound(HeadstartError):
    code = "NOT_FOUND"


class ResourceExhausted(HeadstartError):
    """Admission control: too many sessions or too much queued work."""

    code = "RESOURCE_EXHAUSTED"


class Cancelled(HeadstartError):
    """Work that was no longer needed (a newer snapshot, a disconnect)."""

    code = "CANCELLED"


def validate_text(text: str | bytes, max_chars: int) -> str:
    """Return `text` as a str or raise InvalidInput / TextTooLong.

    Bytes must be valid UTF-8; a str must be encodable (no lone surrogates,
    which JSON `\\ud800` escapes can produce).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"text is not valid UTF-8 (byte {exc.start})") from exc
    if not isinstance(text, str):
        raise InvalidInput(f"text must be a string, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"text is not valid Unicode (lone surrogate at {exc.start})") from exc
    if len(text) > max_chars:
        raise TextTooLong(f"text has {len(text)} characters; the limit is {max_chars}")
    return text
