"""The device tier: table blocks resident on the accelerator, bounded in bytes.

The engine asks the tier for the blocks a request needs. A hit is pinned for
as long as the request uses it; a miss is fetched from the store (CPU tier,
Redis) and admitted, which may evict unpinned blocks in the order of the
eviction policy (LRU / LFU / FIFO). Pinned blocks are never evicted: when the
pinned bytes leave no room, `can_admit` is False and `admit` raises
`TierFullError`, and the caller computes the table instead.

Call order for one request:

    block = tier.get(key, pin=True)              # hit: pinned
    if block is None:
        if tier.can_admit(cpu_block.num_bytes):
            block = tier.admit(cpu_block, pin=True)
    ...                                          # forward pass uses block
    tier.unpin(key)

All methods take one lock: the prefetch thread admits while the compute thread
gets and unpins. The copy to the device happens under the lock; on CUDA it is
a non-blocking copy on a side stream (see `transfer.py`), so the lock is held
only to enqueue it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from headstart.tables.block import TableBlock
from headstart.tables.eviction import EvictionPolicy, make_eviction_policy


class TierFullError(RuntimeError):
    """Not enough unpinned bytes to make room for a block."""


class BlockPinnedError(RuntimeError):
    """A pinned block cannot be removed."""


class DeviceTier:
    """Blocks on one device, at most `capacity_bytes` of KV tensors (see module docstring).

    Args:
        capacity_bytes: budget for the blocks' `num_bytes`.
        policy: an eviction policy or its name (`lru`, `lfu`, `fifo`).
        device: where admitted blocks are moved (`"cpu"` in tests).
        transfer: how a block reaches the device; defaults to `block.to(device)`.
    """

    def __init__(
        self,
        capacity_bytes: int,
        *,
        policy: str | EvictionPolicy = "lru",
        device: torch.device | str = "cpu",
        transfer: Callable[[TableBlock], TableBlock] | None = None,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.device = torch.device(device)
        self.policy = make_eviction_policy(policy) if isinstance(policy, str) else policy
        self._transfer = transfer or (lambda block: block.to(self.device))
        self._blocks: dict[str, TableBlock] = {}
        self._pins: dict[str, int] = {}
        self._used = 0
        self._lock = threading.Lock()
        self.num_hits = 0
        self.num_misses = 0
        self.num_evictions = 0
        self.num_admits = 0

    # -- lookups ---------------------------------------------------------
    def get(self, key: str, *, pin: bool = False) -> TableBlock | None:
        """The block for `key` or None; counts a hit or a miss; `pin` pins a hit."""
        with self._lock:
            block = self._blocks.get(key)
            if block is None:
                self.num_misses += 1
                return None
            self.num_hits += 1
            self.policy.on_access(key)
            if pin:
                self._pins[key] += 1
            return block

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._blocks

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._blocks)

    # -- admission -------------------------------------------------------
    def can_admit(self, num_bytes: int) -> bool:
        """Whether `num_bytes` fit after evicting every unpinned block if needed."""
        with self._lock:
            return self._can_admit(num_bytes)

    def _can_admit(self, num_bytes: int) -> bool:
        return num_bytes <= self.capacity_bytes - self._protected()

    def admit(self, block: TableBlock, *, pin: bool = False) -> TableBlock:
        """Place `block` on the device, evicting unpinned blocks as the policy orders.

        A block already present is returned as is (counted as an access).

        Returns:
            The device copy of the block.
        Raises:
            TierFullError: pinned blocks leave less than `block.num_bytes`.
        """
        key = block.key
        with self._lock:
            present = self._blocks.get(key)
            if present is not None:
                self.policy.on_access(key)
                self._pins[key] += int(pin)
                return present
            need = block.num_bytes
            if not self._can_admit(need):
                raise TierFullError(
                    f"{block.table}: {need} bytes do not fit; capacity {self.capacity_bytes}, "
                    f"pinned {self._protected()}"
                )
            self._evict_until_free(need)
            on_device = self._transfer(block)
            self._blocks[key] = on_device
            self._pins[key] = int(pin)
            self._used += need
            self.policy.on_admit(key)
            self.num_admits += 1
            return on_device

    def _evict_until_free(self, need: int) -> None:
        for victim in self.policy.victims():
            if self.capacity_bytes - self._used >= need:
                return
            if self._pins[victim] == 0:
                self._drop(victim)
                self.num_evictions += 1

    def _drop(self, key: str) -> None:
        block = self._blocks.pop(key)
        del self._pins[key]
        self._used -= block.num_bytes
        self.policy.on_remove(key)

    def remove(self, key: str) -> bool:
        """Drop an unpinned block now; False when absent.

        Raises:
            BlockPinnedError: the block is pinned.
        """
        with self._lock:
            if key not in self._blocks:
                return False
            if self._pins[key]:
                raise BlockPinnedError(f"{key} is pinned {self._pins[key]} time(s)")
            self._drop(key)
            return True

    # -- pins ------------------------------------------------------------
    def pin(self, key: str) -> None:
        """Protect a resident block from eviction (counted: pin twice, unpin twice).

        Raises:
            KeyError: the block is not resident.
        """
        with self._lock:
            if key not in self._blocks:
                raise KeyError(f"{key} is not in the device tier")
            self._pins[key] += 1

    def unpin(self, key: str) -> None:
        """Release one pin.

        Raises:
            KeyError: not resident. ValueError: not pinned.
        """
        with self._lock:
            if key not in self._blocks:
                raise KeyError(f"{key} is not in the device tier")
            if self._pins[key] == 0:
                raise ValueError(f"{key} is not pinned")
            self._pins[key] -= 1

    def pin_count(self, key: str) -> int:
        with self._lock:
            return self._pins.get(key, 0)

    # -- sizes -----------------------------------------------------------
    def _protected(self) -> int:
        return sum(b.num_bytes for k, b in self._blocks.items() if self._pins[k])

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return self.capacity_bytes - self._used

    @property
    def protected_bytes(self) -> int:
        """Bytes of pinned blocks: what eviction cannot take."""
        with self._lock:
            return self._protected()

    @property
    def evictable_bytes(self) -> int:
        """Bytes of unpinned blocks: what eviction can take."""
        with self._lock:
            return self._used - self._protected()

    @property
    def num_blocks(self) -> int:
        with self._lock:
            return len(self._blocks)
