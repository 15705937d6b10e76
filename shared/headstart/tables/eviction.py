"""Eviction policies for a block tier: one interface, LRU / LFU / FIFO (paper, Appendix A).

A policy only orders keys; the tier owns sizes and pins. The tier calls:

- `on_admit(key)` when a block enters the tier (a miss that was filled);
- `on_access(key)` on every hit of a block already in the tier;
- `on_remove(key)` when a block leaves, evicted or removed explicitly;
- `victims()` when it needs room: keys in the order they should go, best
  victim first. The tier skips the pinned ones and stops once enough bytes
  are free, so `victims()` must not change the policy's state.

Orders:
    lru   least recently admitted-or-accessed first (Algorithm 2)
    fifo  earliest admitted first; hits change nothing (Algorithm 3)
    lfu   fewest hits since admission first, ties: least recent use
          (Algorithm 4); a re-admitted key starts again at frequency 1

Pick one by name with `make_eviction_policy(name)` (registry `EVICTION_POLICIES`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator


class EvictionPolicy(ABC):
    """Orders the keys of one tier for eviction (see module docstring)."""

    name: str = ""

    @abstractmethod
    def on_admit(self, key: str) -> None:
        """A block entered the tier. Admitting a present key raises ValueError."""

    @abstractmethod
    def on_access(self, key: str) -> None:
        """A block in the tier was hit. Unknown key: KeyError."""

    @abstractmethod
    def on_remove(self, key: str) -> None:
        """A block left the tier. Unknown key: KeyError."""

    @abstractmethod
    def victims(self) -> Iterator[str]:
        """Keys in eviction order, best victim first (does not change state)."""

    @abstractmethod
    def __len__(self) -> int: ...


class _OrderedPolicy(EvictionPolicy):
    """Keys in an OrderedDict, oldest first; `touch_on_access` makes it LRU."""

    touch_on_access = False

    def __init__(self) -> None:
        self._order: OrderedDict[str, None] = OrderedDict()

    def on_admit(self, key: str) -> None:
        if key in self._order:
            raise ValueError(f"{self.name}: {key!r} admitted twice")
        self._order[key] = None

    def on_access(self, key: str) -> None:
        if key not in self._order:
            raise KeyError(key)
        if self.touch_on_access:
            self._order.move_to_end(key)

    def on_remove(self, key: str) -> None:
        del self._order[key]

    def victims(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)


class LruPolicy(_OrderedPolicy):
    """Least recently used first."""

    name = "lru"
    touch_on_access = True


class FifoPolicy(_OrderedPolicy):
    """First admitted first; hits do not reorder."""

    name = "fifo"


class LfuPolicy(EvictionPolicy):
    """Least frequently used first; ties broken by least recent use.

    NOTE: `victims()` sorts (O(k log k) for k blocks): a device tier holds
    hundreds of table blocks, and eviction happens only on a miss.
    """

    name = "lfu"

    def __init__(self) -> None:
        self._stats: dict[str, tuple[int, int]] = {}  # key -> (frequency, last use tick)
        self._tick = 0

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def on_admit(self, key: str) -> None:
        if key in self._stats:
            raise ValueError(f"lfu: {key!r} admitted twice")
        self._stats[key] = (1, self._next_tick())

    def on_access(self, key: str) -> None:
        freq, _ = self._stats[key]
        self._stats[key] = (freq + 1, self._next_tick())

    def on_remove(self, key: str) -> None:
        del self._stats[key]

    def victims(self) -> Iterator[str]:
        return iter(sorted(self._stats, key=self._stats.__getitem__))

    def frequency(self, key: str) -> int:
        return self._stats[key][0]

    def __len__(self) -> int:
        return len(self._stats)


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    "lru": LruPolicy,
    "lfu": LfuPolicy,
    "fifo": FifoPolicy,
}


def make_eviction_policy(name: str) -> EvictionPolicy:
    """A fresh policy by name.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    try:
        cls = EVICTION_POLICIES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; valid: {sorted(EVICTION_POLICIES)}") from None
    return cls()
