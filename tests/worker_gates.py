"""Hold a forward worker at a known point, so a test can queue jobs behind it; a
test job's work with the hints a test sets (`Work`)."""

from __future__ import annotations

import threading

from headstart.engine.sched.jobs import JobWork, Priority
from headstart.engine.sched.worker import ForwardWorker


class Work(JobWork):
    """A test job's work: `step` and the hints, each a value or a callable read when the scheduler asks."""

    def __init__(self, step=lambda: False, key=None, cost=1, decoding=False, riding=None):
        self._step, self.key, self.tokens, self.decode, self.riding = step, key, cost, decoding, riding

    def step(self):
        return self._step()

    def order_key(self):
        return _read(self.key)

    def cost(self):
        return _read(self.tokens)

    def decoding(self):
        return _read(self.decode)

    def riding_cost(self):
        return _read(self.riding)


def _read(hint):
    return hint() if callable(hint) else hint


def queue_gate(worker: ForwardWorker, gate: threading.Event, held: threading.Event,
               priority: Priority = Priority.FLASH, name: str = "gate") -> None:
    """Queue a job that, once it runs, sets `held` and blocks the worker until `gate` is set."""
    worker.enqueue(lambda: held.set() or (gate.wait(10) and False), priority, name)


def hold_worker(worker: ForwardWorker, priority: Priority = Priority.FLASH, name: str = "gate",
                gate: threading.Event | None = None) -> threading.Event:
    """Block the worker now (returns once it is held); set the returned event to release it."""
    gate, held = gate or threading.Event(), threading.Event()
    queue_gate(worker, gate, held, priority, name)
    assert held.wait(10), "the worker never reached the gate"
    return gate
