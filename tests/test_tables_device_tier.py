"""Device tier: byte capacity, policy-ordered eviction of unpinned blocks, pins, counters."""

from __future__ import annotations

import pytest

from headstart.tables.device_tier import BlockPinnedError, DeviceTier, TierFullError
from tests.tables_blocks import block_bytes, fresh_scope, make_block

SCOPE = fresh_scope()
B = block_bytes(1)  # bytes of a one-token block


def blk(table: str, tokens: int = 1):
    return make_block(SCOPE, table, tokens)


def key(table: str) -> str:
    return SCOPE.block_id(table).key


def resident(tier: DeviceTier) -> str:
    return "".join(t for t in "abcdefgh" if key(t) in tier)


# policy, events ("+k" admit, "k" get), resident tables after; capacity: 3 one-token blocks
CASES = [
    ("lru", "+a +b +c +d", "bcd"),
    ("lru", "+a +b +c a +d", "acd"),
    ("lru", "+a +b +c a b +d +e", "bde"),
    ("fifo", "+a +b +c a +d", "bcd"),
    ("fifo", "+a +b +c a b +d +e", "cde"),
    ("lfu", "+a +b +c a a b +d", "abd"),
    ("lfu", "+a +b +c a a b +d +e", "abe"),
    ("lfu", "+a +b +c c b a +d", "abd"),  # equal frequency: least recent (c) goes
]


@pytest.mark.parametrize(("policy", "events", "after"), CASES)
def test_eviction_order(policy, events, after):
    tier = DeviceTier(3 * B, policy=policy)
    for ev in events.split():
        if ev[0] == "+":
            tier.admit(blk(ev[1:]))
        else:
            assert tier.get(key(ev)) is not None
    assert resident(tier) == after
    assert (tier.used_bytes, tier.free_bytes, tier.num_blocks) == (3 * B, 0, 3)
    assert tier.num_evictions == events.count("+") - 3


def test_pinned_blocks_are_never_evicted():
    tier = DeviceTier(3 * B, policy="lru")
    tier.admit(blk("a"), pin=True)
    tier.admit(blk("b"))
    tier.admit(blk("c"))
    tier.pin(key("b"))
    assert (tier.protected_bytes, tier.evictable_bytes) == (2 * B, B)
    tier.admit(blk("d"))  # only c can go
    assert resident(tier) == "abd"
    assert tier.can_admit(B) and not tier.can_admit(2 * B)
    with pytest.raises(TierFullError, match=f"{2 * B} bytes do not fit; capacity {3 * B}, pinned {2 * B}"):
        tier.admit(blk("e", 2))
    assert resident(tier) == "abd"  # a failed admit evicts nothing
    tier.unpin(key("a"))
    tier.admit(blk("e", 2))
    assert resident(tier) == "be"
    assert (tier.protected_bytes, tier.evictable_bytes, tier.used_bytes) == (B, 2 * B, 3 * B)


def test_refcounted_pins():
    tier = DeviceTier(2 * B)
    tier.admit(blk("a"), pin=True)
    assert tier.get(key("a"), pin=True) is not None
    tier.admit(blk("a"), pin=True)  # already resident: one more pin
    assert tier.pin_count(key("a")) == 3
    for expected in (2, 1, 0):
        tier.unpin(key("a"))
        assert tier.pin_count(key("a")) == expected
    with pytest.raises(ValueError, match="not pinned"):
        tier.unpin(key("a"))
    with pytest.raises(KeyError):
        tier.pin(key("zz"))
    with pytest.raises(KeyError):
        tier.unpin(key("zz"))


def test_remove():
    tier = DeviceTier(2 * B)
    tier.admit(blk("a"), pin=True)
    tier.admit(blk("b"))
    with pytest.raises(BlockPinnedError):
        tier.remove(key("a"))
    assert tier.remove(key("b")) is True and tier.remove(key("b")) is False
    assert (tier.used_bytes, tier.num_blocks, len(tier.policy)) == (B, 1, 1)


def test_counters():
    tier = DeviceTier(2 * B)
    assert tier.get(key("a")) is None
    tier.admit(blk("a"))
    tier.get(key("a"))
    tier.get(key("a"))
    tier.get(key("b"))
    assert (tier.num_hits, tier.num_misses, tier.num_admits, tier.num_evictions) == (2, 2, 1, 0)


def test_block_larger_than_capacity_and_bad_capacity():
    tier = DeviceTier(B)
    assert not tier.can_admit(2 * B)
    with pytest.raises(TierFullError):
        tier.admit(blk("a", 2))
    with pytest.raises(ValueError, match="capacity_bytes"):
        DeviceTier(-1)
    with pytest.raises(ValueError, match="unknown eviction policy"):
        DeviceTier(B, policy="random")


def test_blocks_move_to_the_tier_device():
    tier = DeviceTier(2 * B, device="meta")
    on_device = tier.admit(blk("a"))
    assert on_device.device.type == "meta" and tier.get(key("a")) is on_device


def test_custom_transfer_is_used():
    moved = []
    tier = DeviceTier(2 * B, transfer=lambda b: moved.append(b.table) or b)
    tier.admit(blk("a"))
    tier.admit(blk("a"))
    assert moved == ["a"]
