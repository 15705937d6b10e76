"""Per-tenant shares of what the gateway and the engine can do at once.

Shares add up: a tenant's session share is the engine's capacity (replicas x
sessions per replica) divided among the configured tenants, so one tenant at
its limit still leaves every other tenant its own share; its connection share
(WebSocket connections and gRPC Type streams) is twice its session share. Work is budgeted in
characters the engine must prefill, per tenant (all its connections
together). One-shot completions and Runs run in per-tenant slots: a tenant
past its slots (running and waiting) gets RESOURCE_EXHAUSTED at once instead
of queueing in front of everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from headstart.client.errors import ApiError
from services.gateway.limits import TenantWorkBudget
from services.gateway.settings import GatewaySettings


def session_share(settings: GatewaySettings) -> int:
    """Sessions one tenant may hold: capacity / tenants, never above max_sessions_per_tenant."""
    tenants = max(1, len(set(settings.tokens.values())))
    if not settings.engine_capacity:
        return settings.max_sessions_per_tenant
    return max(1, min(settings.max_sessions_per_tenant, settings.engine_capacity // tenants))


# A tenant's connections per session of its share: the one a session lives on,
# and as many again being opened, reconnecting or not yet sent `open`.
CONNECTIONS_PER_SESSION = 2


def connection_share(settings: GatewaySettings) -> int:
    """WebSocket connections + gRPC Type streams one tenant may hold at once on this gateway:
    CONNECTIONS_PER_SESSION x its session share, never above max_connections_per_tenant."""
    return max(1, min(settings.max_connections_per_tenant, CONNECTIONS_PER_SESSION * session_share(settings)))


@dataclass
class TenantConnections:
    """Counts each tenant's live connections (WebSocket, gRPC Type stream) against `share`.

    A connection counts from the moment it is authenticated until it ends,
    whether or not it has a session yet (a Type stream that has not sent
    `open`, a WebSocket whose open is in flight): so however many a tenant
    opens, the others keep the sockets and tasks of their own share."""

    share: int
    _by_tenant: dict[str, int] = field(default_factory=dict)

    def count(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    def total(self) -> int:
        """Connections of every tenant together (the `headstart_gateway_connections` gauge)."""
        return sum(self._by_tenant.values())

    def acquire(self, tenant: str) -> None:
        """Count one more connection of `tenant`; `release` it when the connection ends.

        Raises:
            ApiError: RESOURCE_EXHAUSTED when the tenant holds its share already.
        """
        if self.count(tenant) >= self.share:
            raise ApiError("RESOURCE_EXHAUSTED", f"this tenant has {self.share} connections open (its share)")
        self._by_tenant[tenant] = self.count(tenant) + 1

    def release(self, tenant: str) -> None:
        left = self.count(tenant) - 1
        if left > 0:
            self._by_tenant[tenant] = left
        else:
            self._by_tenant.pop(tenant, None)


@dataclass
class _Slots:
    semaphore: asyncio.Semaphore
    holders: int = 0  # running + waiting


@dataclass
class TenantSlots:
    """At most `running` calls per tenant at once and `waiting` more queued behind them."""

    what: str
    running: int
    waiting: int
    _by_tenant: dict[str, _Slots] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str):
        slots = self._by_tenant.get(tenant)
        if slots is None:
            slots = self._by_tenant[tenant] = _Slots(asyncio.Semaphore(self.running))
        if slots.holders >= self.running + self.waiting:
            raise ApiError("RESOURCE_EXHAUSTED", f"this tenant has {self.running} {self.what} running "
                                                 f"and {self.waiting} waiting")
        slots.holders += 1
        try:
            async with slots.semaphore:
                yield
        finally:
            slots.holders -= 1


class TenantQuotas:
    """Everything one gateway counts per tenant."""

    def __init__(self, settings: GatewaySettings):
        self.session_share = session_share(settings)
        self.connections = TenantConnections(connection_share(settings))
        self.work = TenantWorkBudget(settings.tenant_chars_per_s, settings.tenant_chars_burst)
        self.data_work = TenantWorkBudget(settings.data_chars_per_s, settings.data_chars_burst)
        self.completes = TenantSlots("completions", settings.completes_per_tenant, 0)
        self.executes = TenantSlots("Runs", settings.executes_per_tenant, settings.executes_per_tenant)
