"""Eviction policies: the victim order of LRU, LFU and FIFO after a sequence of events."""

from __future__ import annotations

import pytest

from headstart.tables.eviction import EVICTION_POLICIES, LfuPolicy, make_eviction_policy

# policy, events ("+k" admit, "k" access, "-k" remove), expected victims (best first)
CASES = [
    ("lru", "+a +b +c", "abc"),
    ("lru", "+a +b +c a", "bca"),
    ("lru", "+a +b +c a b", "cab"),
    ("lru", "+a +b +c -b +b", "acb"),
    ("fifo", "+a +b +c", "abc"),
    ("fifo", "+a +b +c a a b", "abc"),
    ("fifo", "+a +b +c -a +a", "bca"),
    ("lfu", "+a +b +c", "abc"),
    ("lfu", "+a +b +c a", "bca"),
    ("lfu", "+a +b +c a a b", "cba"),
    ("lfu", "+a +b +c c b", "acb"),  # equal frequency: least recently used first
    ("lfu", "+a +b a a -a +a", "ba"),  # re-admitted: frequency back to 1, newer than b
    ("lfu", "+a +b b -b +c +b", "acb"),
]


def _apply(policy, events: str) -> None:
    for ev in events.split():
        if ev[0] == "+":
            policy.on_admit(ev[1:])
        elif ev[0] == "-":
            policy.on_remove(ev[1:])
        else:
            policy.on_access(ev)


@pytest.mark.parametrize(("name", "events", "victims"), CASES)
def test_victim_order(name, events, victims):
    policy = make_eviction_policy(name)
    _apply(policy, events)
    assert "".join(policy.victims()) == victims
    assert "".join(policy.victims()) == victims  # asking does not change state
    assert len(policy) == len(victims) and policy.name == name


def test_lfu_counts():
    policy = LfuPolicy()
    _apply(policy, "+a +b a a b")
    assert (policy.frequency("a"), policy.frequency("b")) == (3, 2)


@pytest.mark.parametrize("name", sorted(EVICTION_POLICIES))
def test_misuse(name):
    policy = make_eviction_policy(name.upper())
    policy.on_admit("a")
    with pytest.raises(ValueError, match="admitted twice"):
        policy.on_admit("a")
    with pytest.raises(KeyError):
        policy.on_access("zz")
    with pytest.raises(KeyError):
        policy.on_remove("zz")


def test_unknown_policy_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown eviction policy 'arc'; valid: \['fifo', 'lfu', 'lru'\]"):
        make_eviction_policy("arc")
