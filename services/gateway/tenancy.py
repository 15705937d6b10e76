"""Per-tenant shares of what the gateway and the engine can do at once.

Shares add up: a tenant's session share is the engine's capacity (replicas x
sessions per replica) divided among the configured tenants, so one tenant at
its limit still leaves every other tenant its own share. Work is budgeted in
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
        self.work = TenantWorkBudget(settings.tenant_chars_per_s, settings.tenant_chars_burst)
        self.completes = TenantSlots("completions", settings.completes_per_tenant, 0)
        self.executes = TenantSlots("Runs", settings.executes_per_tenant, settings.executes_per_tenant)
