"""Query reranking: order pending requests so consecutive ones share tables.

From the paper (section 4.2.1): each request is a bitset over tables; the
distance of two requests is the popcount of the XOR of their bitsets (the
number of tables one needs and the other does not). Starting from an anchor,
the next request is always the nearest remaining one to the last placed
(greedy nearest neighbour), so blocks loaded for one request are still on
the device for the next.

Starvation guard (ours, the paper has none): request i (its arrival
position) is placed at position <= i + max_delay. When position t is filled
and the request that arrived at t - max_delay is still waiting, it is placed
now, whatever its distance. Deadlines are distinct, so at most one request is
due per position and the guard can always be honoured. max_delay=0 is FIFO.

Ties (equal distance) go to the earliest arrival: deterministic, and fair.
Cost O(N^2 * m / 64) for N requests over m tables, Python ints as bitsets.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def table_bitsets(table_sets: Sequence[Collection[str]]) -> list[int]:
    """One int bitset per request; bit k is the k-th table name in sorted order."""
    names = sorted({t for tables in table_sets for t in tables})
    bit = {name: 1 << k for k, name in enumerate(names)}
    return [sum(bit[t] for t in set(tables)) for tables in table_sets]


def distance(a: int, b: int) -> int:
    """Hamming distance of two bitsets: tables in exactly one of the two."""
    return (a ^ b).bit_count()


def rerank(
    table_sets: Sequence[Collection[str]],
    *,
    max_delay: int,
    anchor: int | Collection[str] = 0,
) -> list[int]:
    """A serving order for pending requests, as a permutation of their indices.

    Args:
        table_sets: the tables each pending request needs, in arrival order.
        max_delay: a request is never placed more than this many positions
            after its arrival position.
        anchor: an index (that request goes first, if the guard allows) or a
            set of tables (e.g. those on the device now: the first request is
            the nearest to it).

    Raises:
        ValueError: max_delay < 0, or an anchor index out of range.
    """
    if max_delay < 0:
        raise ValueError(f"max_delay must be >= 0, got {max_delay}")
    n = len(table_sets)
    if n == 0:
        return []
    if isinstance(anchor, int) and not 0 <= anchor < n:
        raise ValueError(f"anchor {anchor} out of range for {n} requests")
    bits = table_bitsets(list(table_sets) + ([] if isinstance(anchor, int) else [anchor]))
    ref = bits[anchor] if isinstance(anchor, int) else bits[n]
    waiting = list(range(n))  # kept in arrival order: ties go to the earliest
    order: list[int] = []
    for t in range(n):
        due = t - max_delay
        if due >= 0 and due in waiting:
            pick = due
        elif t == 0 and isinstance(anchor, int):
            pick = anchor
        else:
            pick = min(waiting, key=lambda i: (distance(ref, bits[i]), i))
        waiting.remove(pick)
        order.append(pick)
        ref = bits[pick]
    return order


def total_distance(table_sets: Sequence[Collection[str]], order: Sequence[int]) -> int:
    """Sum of distances between consecutive requests in `order` (table switches)."""
    bits = table_bitsets(table_sets)
    return sum(distance(bits[a], bits[b]) for a, b in zip(order, order[1:]))
