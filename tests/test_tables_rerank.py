"""Query reranking: greedy nearest neighbour by table XOR distance, with a starvation guard."""

from __future__ import annotations

import random

import pytest

from headstart.tables.rerank import distance, rerank, table_bitsets, total_distance

AB, CD = {"a", "b"}, {"c", "d"}
ALTERNATING = [AB, CD, AB, CD, AB, CD]

CASES = [
    ("groups alike", ALTERNATING, 10, 0, [0, 2, 4, 1, 3, 5]),
    ("guard of 2 still allows it", ALTERNATING, 2, 0, [0, 2, 4, 1, 3, 5]),
    ("guard of 1 forces early ones", ALTERNATING, 1, 0, [0, 2, 1, 3, 5, 4]),
    ("guard of 0 is FIFO", ALTERNATING, 0, 0, [0, 1, 2, 3, 4, 5]),
    ("anchor index", ALTERNATING, 10, 1, [1, 3, 5, 0, 2, 4]),
    ("anchor = tables on the device", ALTERNATING, 10, {"c", "d"}, [1, 3, 5, 0, 2, 4]),
    ("ties go to the earliest", [{"a", "x"}, {"b"}, {"a"}, {"x"}], 10, 0, [0, 2, 1, 3]),
    ("partial overlap", [{"a", "b", "c"}, {"x"}, {"a", "b"}, {"a", "x"}, {"a"}], 10, 0, [0, 2, 4, 3, 1]),
    ("no tables at all", [set(), set(), {"a"}], 10, 0, [0, 1, 2]),
    ("single request", [{"a"}], 3, 0, [0]),
    ("empty queue", [], 3, 0, []),
]


@pytest.mark.parametrize(("name", "sets", "max_delay", "anchor", "order"), CASES, ids=[c[0] for c in CASES])
def test_rerank(name, sets, max_delay, anchor, order):
    assert rerank(sets, max_delay=max_delay, anchor=anchor) == order


def test_sharing_improves_on_fifo():
    order = rerank(ALTERNATING, max_delay=10)
    assert total_distance(ALTERNATING, order) == 4
    assert total_distance(ALTERNATING, range(6)) == 20


@pytest.mark.parametrize("seed", range(200))
def test_starvation_guard_holds(seed):
    rng = random.Random(seed)
    pool = [f"t{i}" for i in range(rng.randint(1, 12))]
    sets = [set(rng.sample(pool, rng.randint(0, len(pool)))) for _ in range(rng.randint(0, 40))]
    max_delay = rng.randint(0, 6)
    anchor = rng.choice([0, set(rng.sample(pool, 2 if len(pool) > 1 else 1))]) if sets else 0
    if sets and rng.random() < 0.3:
        anchor = rng.randrange(len(sets))
    order = rerank(sets, max_delay=max_delay, anchor=anchor)
    assert sorted(order) == list(range(len(sets)))
    late = [(i, pos) for pos, i in enumerate(order) if pos > i + max_delay]
    assert late == []


def test_adversarial_queue_for_the_oldest_request():
    """The oldest request is unlike all others; the guard still serves it in time."""
    sets = [{"odd"}] + [{"a", "b"}] * 30
    order = rerank(sets, max_delay=5, anchor=1)
    assert order.index(0) == 5


def test_bitsets_and_distance():
    bits = table_bitsets([{"b", "a"}, {"c"}, {"a", "c"}])
    assert bits == [0b011, 0b100, 0b101]
    assert [distance(bits[0], bits[1]), distance(bits[0], bits[2]), distance(bits[1], bits[1])] == [3, 2, 0]


def test_errors():
    with pytest.raises(ValueError, match="max_delay must be >= 0"):
        rerank([{"a"}], max_delay=-1)
    with pytest.raises(ValueError, match="anchor 3 out of range for 1"):
        rerank([{"a"}], max_delay=1, anchor=3)
