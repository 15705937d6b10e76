"""Tenants from bearer tokens. A tenant sees only its own sessions."""

from __future__ import annotations

import base64
import binascii
import hmac

from headstart.client.errors import ApiError

ANONYMOUS = "local"  # the tenant of every caller when no token is configured


class Authenticator:
    """Maps `Authorization: Bearer <token>` to a tenant name (constant-time compare)."""

    def __init__(self, tokens: dict[str, str]):
        self._tokens = dict(tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def tenant(self, authorization: str | None = None, token: str | None = None) -> str:
        """The tenant of a header value (`Bearer X`) or a bare token.

        Raises:
            ApiError: UNAUTHENTICATED when tokens are configured and none matches.
        """
        if not self._tokens:
            return ANONYMOUS
        if token is None and authorization:
            scheme, _, value = authorization.partition(" ")
            token = value.strip() if scheme.lower() == "bearer" else None
        if token:
            for known, tenant in self._tokens.items():
                if hmac.compare_digest(known.encode(), token.encode()):
                    return tenant
        raise ApiError("UNAUTHENTICATED", "missing or unknown bearer token")


# A browser's WebSocket cannot send an Authorization header; it may offer
# subprotocols (the Sec-WebSocket-Protocol header), so the page offers
# `headstart` and `bearer.<base64url token>` (Kubernetes' API server reads
# `base64url.bearer.authorization.k8s.io.<token>` the same way). The gateway
# accepts `headstart`; the token never appears in a URL (nor in access logs).
WS_SUBPROTOCOL = "headstart"
WS_BEARER_PREFIX = "bearer."


def websocket_token(protocol_header: str | None) -> tuple[str | None, str | None]:
    """(the bearer token offered in a Sec-WebSocket-Protocol header, the subprotocol to accept).

    Raises:
        ApiError: UNAUTHENTICATED when the bearer entry is not base64url.
    """
    offered = [p.strip() for p in (protocol_header or "").split(",") if p.strip()]
    token = None
    for entry in offered:
        if entry.startswith(WS_BEARER_PREFIX):
            raw = entry[len(WS_BEARER_PREFIX):]
            try:
                token = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise ApiError("UNAUTHENTICATED", "the bearer subprotocol is not base64url") from None
    return token, WS_SUBPROTOCOL if WS_SUBPROTOCOL in offered else None


def parse_token_specs(specs: list[str]) -> dict[str, str]:
    """`TOKEN` or `TENANT=TOKEN` strings (the CLI's --token) -> {token: tenant}."""
    tokens: dict[str, str] = {}
    for i, spec in enumerate(specs):
        tenant, sep, token = spec.partition("=")
        if not sep:
            tenant, token = f"tenant{i}", spec
        if not token or not tenant:
            raise ValueError(f"bad token spec {spec!r}: use TOKEN or TENANT=TOKEN")
        tokens[token] = tenant
    return tokens
