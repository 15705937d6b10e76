"""Tenants from bearer tokens. A tenant sees only its own sessions."""

from __future__ import annotations

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
