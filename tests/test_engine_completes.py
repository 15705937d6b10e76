"""The replica's registry of running Completes (services/engine/completes.py): a CancelComplete
stops its request whenever it arrives, before the Complete, while it is being prepared, or after."""

from __future__ import annotations

from services.engine.completes import MAX_TOMBSTONES, TOMBSTONE_S, CompleteRegistry


class Request:
    """Stands in for a GenerationRequest: only `cancel()` is called."""

    cancelled = False

    def cancel(self):
        self.cancelled = True


def test_a_cancel_stops_the_request_whenever_it_arrives():
    now = [0.0]
    reg = CompleteRegistry(clock=lambda: now[0])
    # after the request is queued
    req = Request()
    assert reg.begin("a")
    reg.started("a", req)
    assert reg.cancel("a") and req.cancelled
    # while it is being prepared (arrived, not queued): stopped the moment it is queued
    req = Request()
    assert reg.begin("b") and reg.cancel("b")
    reg.started("b", req)
    assert req.cancelled
    # before it arrives: refused when it comes, once
    assert not reg.cancel("c")
    assert not reg.begin("c") and reg.begin("c")
    # a finished one is forgotten; a late cancel only leaves a tombstone that expires
    req = Request()
    assert reg.begin("d")
    reg.started("d", req)
    reg.end("d")
    assert not reg.cancel("d") and not req.cancelled
    now[0] += TOMBSTONE_S + 1
    assert reg.begin("d")


def test_tombstones_are_bounded():
    reg = CompleteRegistry(clock=lambda: 0.0)
    for i in range(MAX_TOMBSTONES + 5):
        reg.cancel(f"x{i}")
    assert reg.begin("x0") and reg.begin("x4") and not reg.begin("x5")  # the oldest five went first
