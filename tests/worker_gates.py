"""Hold a forward worker at a known point, so a test can queue jobs behind it."""

from __future__ import annotations

import threading

from headstart.engine.scheduler_types import Priority
from headstart.engine.worker import ForwardWorker


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
