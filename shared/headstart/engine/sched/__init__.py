"""Scheduling: jobs, the one scheduler that orders them, and the worker thread that runs them.

- `jobs`: `Priority`, `Job`, `JobWork` (a job's step, commit and hints), `Call`, `Plan`.
- `scheduler.Scheduler`: decides what runs next (`schedule`) and applies the outcomes (`postprocess`).
- `ordering`: the rules that order waiting jobs across tenants and rerank table-cache completions.
- `worker.ForwardWorker`: the one thread that runs every plan (step, forward, commit).
- `forwards`: a plan's rows split into packed forwards by the token budget.
- `extensions`: work that interleaves forwards with other steps (table assembly, P0 prefills).
- `tenant_worker.TenantWorker`, `forward_trace.ForwardTrace`: a tenant-stamping view, a per-iteration trace.
"""

from headstart.engine.sched.jobs import Call, Job, JobWork, Plan, Priority
from headstart.engine.sched.scheduler import Scheduler
from headstart.engine.sched.worker import ForwardWorker

__all__ = ["Call", "ForwardWorker", "Job", "JobWork", "Plan", "Priority", "Scheduler"]
