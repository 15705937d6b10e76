"""Host -> device copies of table blocks that overlap with compute.

On CUDA: the host tensors are put in pinned (page-locked) memory, copied with
`non_blocking=True` on a dedicated side stream, and an event is recorded
after each copy. Before the compute stream reads the blocks it calls
`wait()`, which makes that stream wait on the events (no host sync) and
records the stream on the new tensors so the caching allocator does not hand
their memory to the side stream while compute still reads it.

On CPU (tests, CPU serving): a plain `.to(device)`; `wait()` does nothing.

Use as the `transfer` of a `DeviceTier`; call `wait()` at the start of
`compute` in the load/compute pipeline.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import torch

from headstart.tables.block import TableBlock


class BlockTransfer:
    """Copies blocks to `device`; asynchronous on CUDA (see module docstring)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.is_async = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(device=self.device) if self.is_async else None
        self._pending: list[tuple[torch.cuda.Event, list[torch.Tensor]]] = []
        self._lock = threading.Lock()

    def __call__(self, block: TableBlock) -> TableBlock:
        """Start copying `block`; the result may only be read after `wait()`."""
        if not self.is_async:
            return block.to(self.device)
        if block.device == self.device:
            return block
        host = [t if t.is_pinned() else t.pin_memory() for t in (block.keys_pre_rope, block.values)]
        with torch.cuda.stream(self._stream):
            keys, values = (t.to(self.device, non_blocking=True) for t in host)
            event = torch.cuda.Event()
            event.record(self._stream)
        with self._lock:
            self._pending.append((event, [keys, values]))
        return replace(block, keys_pre_rope=keys, values=values)

    def wait(self, stream: "torch.cuda.Stream | None" = None) -> None:
        """Make `stream` (default: the current one) wait for every copy started so far."""
        if not self.is_async:
            return
        stream = stream or torch.cuda.current_stream(self.device)
        with self._lock:
            pending, self._pending = self._pending, []
        for event, tensors in pending:
            stream.wait_event(event)
            for t in tensors:
                t.record_stream(stream)
