"""A view of the forward worker that stamps every job it queues with a tenant.

A session queues its typing, answer-ahead and submit jobs through the worker
it was given; the runtime gives it a `TenantWorker`, so every job of the
session carries the tenant it belongs to, and the scheduler can order work
of one class fairly across tenants (`headstart.engine.sched.scheduler`, rule 6)
without the session knowing about tenants.
"""

from __future__ import annotations


class TenantWorker:
    """Forwards everything to `worker`; `enqueue` adds `tenant=`.

    Args:
        worker: the `ForwardWorker`.
        tenant: the tenant of every job queued through this view (None: none).
    """

    def __init__(self, worker, tenant: str | None):
        self._worker = worker
        self.tenant = tenant

    def enqueue(self, *args, **kwargs):
        kwargs.setdefault("tenant", self.tenant)
        return self._worker.enqueue(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._worker, name)
