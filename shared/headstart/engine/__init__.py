"""The engine: one model on one process, its caches, its scheduler and its sessions.

Parts, bottom to top (each imports only those below it):

- `kv/`: KV memory (`KVState`, the block pool, the KV budget, the P0 store).
- `runner/`: the model runner, the one owner of forwards and kernels (`ModelRunner`, `Row`).
- `sched/`: jobs, the scheduler and the forward worker thread.
- `requests/`: a submit's or completion's request (catch-up rule, decode step, sampling).
- `sessions/`: typing sessions (typing job, answer-ahead, policies, the session table).
- `prefix_source.py`: where a prompt's head comes from (P0, or table blocks).
- `runtime.py`: `EngineRuntime`, the entry point every caller uses.
- `errors.py`, `states.py`: typed errors, and the session and request state machines.

docs/architecture.md draws the same parts. Names are imported from their
modules (`headstart.engine.runtime.EngineRuntime`); this package face loads
nothing, so importing `headstart.engine.errors` stays light (the gateway
imports it without torch).
"""
