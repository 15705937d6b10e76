"""Errors in OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`.

Every failure of the OpenAI-compatible routes is an `OpenAIError`; our typed
errors (`ApiError`) become one with OpenAI's code name where it has one
(`context_length_exceeded`, `rate_limit_exceeded`, `invalid_api_key`). A
prompt that is too long is a 400, as OpenAI and vLLM answer it (our REST API
says 413), so the SDK raises `BadRequestError` for it.
"""

from __future__ import annotations

from headstart.client.errors import ApiError, http_status

_OPENAI_CODES = {"UNAUTHENTICATED": "invalid_api_key", "PROMPT_TOO_LONG": "context_length_exceeded",
                 "TEXT_TOO_LONG": "context_length_exceeded", "RATE_LIMITED": "rate_limit_exceeded",
                 "RESOURCE_EXHAUSTED": "rate_limit_exceeded"}
OPENAI_CODE_NAMES = frozenset(_OPENAI_CODES.values())  # OpenAI's names; every other code is ours in lower case
# OpenAI answers a prompt beyond the context with 400, not 413.
_OPENAI_STATUS = {"PROMPT_TOO_LONG": 400, "TEXT_TOO_LONG": 400}


class OpenAIError(Exception):
    """A failure in OpenAI's shape, with its HTTP status."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None, type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.type = type_ or error_type(status)

    @classmethod
    def from_api(cls, exc: ApiError, param: str | None = None) -> "OpenAIError":
        """Our typed error: REST's HTTP status (400 for a too-long prompt), OpenAI's code name where it has one."""
        status = _OPENAI_STATUS.get(exc.code, http_status(exc.code))
        return cls(status, exc.message, _OPENAI_CODES.get(exc.code, exc.code.lower()), param)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def bad_param(param: str, message: str) -> OpenAIError:
    """400 `invalid_value` naming the parameter."""
    return OpenAIError(400, message, "invalid_value", param)


def unsupported_param(param: str, why: str) -> OpenAIError:
    """400 `unsupported_parameter` naming it: a parameter headstart does not honour is refused, never ignored."""
    return OpenAIError(400, f"{param} is not supported by headstart: {why}", "unsupported_parameter", param)
