"""KV in pool blocks (`engine/kv/block_pool.py`, `engine/kv/paged_cache.py`): shared
blocks are never written, a shared state behaves exactly like a private
copy, crops and dropped caches give blocks back, and the packed runner reads
the blocks in place."""

from __future__ import annotations

import gc

import pytest
import torch

from headstart.engine.kv.block_pool import BlockPool, PoolError
from headstart.engine.kv.state import KVState
from headstart.engine.runner.rows import Row
from headstart.engine.kv.paged_cache import PagedCache


def _kv(tokens: int, start: float = 0.0, heads: int = 2, dim: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.arange(tokens * heads * dim, dtype=torch.float64).view(1, heads, tokens, dim) + start
    return k, -k


def _pool(block_tokens: int = 4, slab_blocks: int = 4) -> BlockPool:
    return BlockPool(2, 4, torch.float64, "cpu", block_tokens=block_tokens, slab_blocks=slab_blocks)


def test_blocks_are_counted_shared_and_given_back():
    pool = _pool()
    a = pool.allocate(3)
    assert a == [0, 1, 2] and pool.stats().used_blocks == 3 and pool.stats().total_blocks == 4
    assert pool.allocate(2, after=2) == [3, 4]  # block 3 follows; 4 starts the next slab
    pool.retain([0])
    assert pool.is_shared(0) and not pool.is_shared(1) and pool.stats().shared_blocks == 1
    pool.release([0, 1, 2, 3, 4])
    assert pool.stats().used_blocks == 1 and pool.stats().total_blocks == 4  # slab 1 is empty: dropped
    with pytest.raises(PoolError):
        pool.release([1])  # already free
    with pytest.raises(PoolError):
        pool.retain([2])  # free blocks cannot be shared
    pool.release([0])
    assert pool.stats().used_blocks == 0 and pool.stats().total_blocks == 0


def test_a_cache_round_trips_its_tokens_across_blocks_and_slabs():
    pool = _pool()
    cache = PagedCache(pool)
    k, v = _kv(23)
    for layer in range(3):
        cache.append(layer, k[:, :, :5], v[:, :, :5])  # two writes: across a block's end
        cache.append(layer, k[:, :, 5:], v[:, :, 5:])  # and a slab's (16 tokens)
    assert cache.num_tokens == 23 and len(cache.blocks) == 6
    for layer in range(cache.num_layers):
        assert torch.equal(cache.keys(layer), k) and torch.equal(cache.values(layer), v)
        assert len(cache.segments(layer)) == 2  # one piece per slab: its blocks are one run
    cache.crop_to(9)  # blocks 3.. go back
    assert len(cache.blocks) == 3 and pool.stats().used_blocks == 3
    assert torch.equal(cache.keys(1), k[:, :, :9])
    del cache
    assert pool.stats().used_blocks == 0  # at once: a table is in no reference cycle


def test_a_shared_block_is_copied_before_it_is_written():
    pool = _pool()
    p0 = PagedCache(pool)
    k, v = _kv(6)
    p0.append(0, k, v)
    session = p0.shared()
    assert session.blocks == p0.blocks and all(pool.is_shared(b) for b in p0.blocks)
    extra, extra_v = _kv(3, start=1000.0)
    session.append(0, extra, extra_v)  # writes into P0's half-full second block: copied first
    assert session.blocks[0] == p0.blocks[0] and session.blocks[1] != p0.blocks[1]
    assert torch.equal(p0.keys(0), k)  # P0 untouched
    assert torch.equal(session.keys(0), torch.cat([k, extra], dim=-2))
    session.crop_to(2)  # into the shared first block: nothing of P0 is freed
    assert session.blocks == p0.blocks[:1] and torch.equal(p0.keys(0), k)
    session.append(0, extra, extra_v)
    assert session.blocks[0] != p0.blocks[0] and torch.equal(p0.keys(0), k)
    assert torch.equal(session.keys(0), torch.cat([k[:, :, :2], extra], dim=-2))


def test_a_paged_cache_refuses_batches_and_foreign_shapes():
    cache = PagedCache(_pool())
    k, v = _kv(2)
    with pytest.raises(ValueError, match="one sequence"):
        cache.append(0, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1))
    with pytest.raises(PoolError, match="do not fit"):
        cache.append(0, k[:, :1], v[:, :1])  # one kv head, not the pool's two


# (tokens kept by a crop, relative to the end of P0: negative crops into P0)
@pytest.mark.parametrize("keep_from_p0_end", [3, 0, -2])
@pytest.mark.parametrize("batched", [False, True])
def test_shared_state_equals_a_copy_and_leaves_p0_untouched(tiny_runtime, keep_from_p0_end, batched):
    runner = tiny_runtime.runner
    prompt = tiny_runtime.prompt_for("world_1")
    ids = prompt.prompt_ids("How many cities are in France?")
    p0 = runner.prefill(prompt.base_ids)
    layers = range(p0.cache.num_layers)
    before = [(p0.cache.keys(i).clone(), p0.cache.values(i).clone()) for i in layers]
    shared, copied = p0.share(), p0.copy()
    assert shared.cache.blocks == p0.cache.blocks and shared.nbytes() == 0
    assert shared.shared_nbytes() == p0.nbytes() == len(p0.ids) * p0.token_bytes()  # P0 counts its blocks
    for state in (shared, copied):
        runner.extend(state, ids[len(p0.ids):len(p0.ids) + 6])
        state.crop(len(p0.ids) + keep_from_p0_end)
    rest = ids[shared.num_tokens:]
    if batched:  # the packed runner reads the shared blocks in place
        other = p0.share()
        assert runner.extend_rows([Row(shared, rest), Row(other, ids[len(p0.ids):])]) == [True] * 2
        assert torch.allclose(other.last_logits, runner.prefill(ids).last_logits, atol=1e-10)
    else:
        runner.extend(shared, rest)
    runner.extend(copied, rest)
    assert shared.ids == copied.ids == ids
    for i in layers:
        assert torch.allclose(shared.cache.keys(i), copied.cache.keys(i), atol=1e-12)
        assert torch.allclose(shared.cache.values(i), copied.cache.values(i), atol=1e-12)
    assert torch.allclose(shared.last_logits, copied.last_logits, atol=1e-10)
    # its own: every token from the block the first write fell in (that block was copied)
    size = shared.cache.pool.block_tokens
    first_write = min(len(p0.ids), len(p0.ids) + keep_from_p0_end)
    kept_shared = first_write // size * size
    assert shared.nbytes() == (len(ids) - kept_shared) * p0.token_bytes()
    assert shared.shared_nbytes() == kept_shared * p0.token_bytes()
    for i, (keys, values) in zip(layers, before):
        assert torch.equal(p0.cache.keys(i), keys) and torch.equal(p0.cache.values(i), values)  # P0 never written


def test_the_packed_runner_never_joins_a_cache(tiny_runtime, monkeypatch):
    """The packed runner attends to the blocks in place and writes new keys
    into them: no forward makes (and drops) a joined copy of a layer's cache,
    which cost a copy of the whole cache per layer, row and forward."""
    runner = tiny_runtime.runner
    prompt = tiny_runtime.prompt_for("world_1")
    ids = prompt.prompt_ids("How many cities are in France?")
    p0 = runner.prefill(prompt.base_ids)
    rows = [p0.share(), p0.share()]
    runner.extend(rows[0], ids[len(p0.ids):len(p0.ids) + 4])  # tokens of its own before the forward
    joins = []
    real_keys, real_values = PagedCache.keys, PagedCache.values
    monkeypatch.setattr(PagedCache, "keys", lambda self, layer: joins.append(layer) or real_keys(self, layer))
    monkeypatch.setattr(PagedCache, "values", lambda self, layer: joins.append(layer) or real_values(self, layer))
    assert runner.extend_rows([Row(rows[0], ids[len(p0.ids) + 4:]),
                               Row(rows[1], ids[len(p0.ids):])]) == [True] * 2
    assert joins == []
    monkeypatch.undo()
    assert rows[0].ids == rows[1].ids == ids
    assert torch.allclose(rows[0].last_logits, runner.prefill(ids).last_logits, atol=1e-10)
    assert torch.allclose(rows[1].last_logits, rows[0].last_logits, atol=1e-10)


def test_dropped_states_give_their_blocks_back(tiny_runtime):
    runner = tiny_runtime.runner
    prompt = tiny_runtime.prompt_for("world_1")
    p0 = runner.prefill(prompt.base_ids)
    pool = p0.cache.pool
    gc.collect()
    before = pool.stats().used_blocks
    states = [p0.share() for _ in range(4)]
    for state in states:
        runner.extend(state, prompt.prompt_ids("How many cities?")[len(p0.ids):])
    assert pool.stats().used_blocks > before
    states[0].crop(0)
    del states, state
    assert pool.stats().used_blocks == before


def test_a_state_counts_the_blocks_it_owns_and_its_sharers_borrow_them():
    """A live cache shared by a snapshot keeps counting its blocks as its own;
    the snapshot counts them as borrowed, and KV accounting counts them once."""
    from headstart.engine.kv.memory import KVMemory

    pool = _pool()
    live = KVState(list(range(10)), PagedCache(pool))
    k, v = _kv(10)
    live.cache.append(0, k, v)
    bpt = live.token_bytes()
    snapshot = live.share()
    assert (live.nbytes(), live.shared_nbytes()) == (10 * bpt, 0)
    assert (snapshot.nbytes(), snapshot.shared_nbytes()) == (0, 10 * bpt)
    tail, tail_v = _kv(3, start=50.0)
    snapshot.cache.append(0, tail, tail_v)  # into live's half-full third block: copied, now its own
    snapshot.ids.extend([10, 11, 12])
    assert (snapshot.nbytes(), snapshot.shared_nbytes()) == (5 * bpt, 8 * bpt)
    usage = KVMemory(0, bpt, session_reserve_tokens=0).usage([snapshot], stored=[live])
    assert (usage.shared_bytes, usage.session_bytes) == (10 * bpt, 5 * bpt)
    assert (usage.block_tokens, usage.blocks_used, usage.blocks_shared) == (4, 5, 2)  # live 3, its copy of one, one more


def test_caches_dropped_on_other_threads_while_the_worker_writes_lose_nothing():
    """Sessions close on gRPC threads while the worker extends other caches:
    the pool's counts stay exact and no cache reads another's tokens."""
    import threading

    pool = _pool(block_tokens=4, slab_blocks=8)
    base = PagedCache(pool)
    k, v = _kv(10)
    base.append(0, k, v)
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        try:
            for i in range(200):
                mine = base.shared()
                extra, extra_v = _kv(3 + (i + seed) % 9, start=seed * 1000.0 + i)
                mine.append(0, extra, extra_v)
                assert torch.equal(mine.keys(0), torch.cat([k, extra], dim=-2))
                del mine  # its blocks go back on this thread
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]
    assert torch.equal(base.keys(0), k)
    assert pool.stats().used_blocks == len(base.blocks) == 3 and pool.stats().shared_blocks == 0


def test_free_blocks_give_their_pages_back_and_blocks_in_use_keep_their_tokens():
    """`give_back_free_pages` drops the pages of free blocks only (what a
    replica's idle trim calls): a cache still holding blocks of the slab reads
    its tokens unchanged, and a block taken again is written as usual."""
    import sys

    pool = BlockPool(2, 256, torch.float32, "cpu", block_tokens=16, slab_blocks=8)  # 16 KiB per head and block
    keep, drop = PagedCache(pool), PagedCache(pool)
    k = torch.randn(1, 2, 40, 256)
    keep.append(0, k, -k)
    drop.append(0, torch.ones(1, 2, 80, 256), torch.ones(1, 2, 80, 256))
    drop.crop_to(0)
    given = pool.give_back_free_pages()
    if sys.platform.startswith("linux"):
        assert given >= 2 * 2 * 4 * 16 * 256 * 4  # the freed blocks' whole pages, keys and values of both heads
    assert torch.equal(keep.keys(0), k) and torch.equal(keep.values(0), -k)
    again = PagedCache(pool)
    again.append(0, k, k)
    assert torch.equal(again.keys(0), k) and torch.equal(keep.keys(0), k)


def test_a_cache_collected_inside_the_pools_locked_code_does_not_hang_it():
    """The garbage collector can run at any allocation, also inside the pool's
    locked code, and collect a cache held by garbage in a cycle: its finalizer
    then gives blocks back on the thread that holds the lock. Waiting for the
    lock there hung a replica for good (its health checks unanswered)."""
    import threading

    pool = _pool()
    cache = PagedCache(pool)
    cache.append(0, *_kv(6))  # two blocks
    held = pool.stats().used_blocks
    cycle = [cache]
    cycle.append(cycle)  # only the cyclic collector frees it
    del cache, cycle
    grow = pool._grow

    def grow_and_collect():  # a collection at an allocation inside `allocate`'s lock
        gc.collect()
        grow()

    pool._grow = grow_and_collect
    done = []
    worker = threading.Thread(target=lambda: done.append(pool.allocate(pool.stats().free_blocks + 1)), daemon=True)
    gc.disable()  # no collection before the one inside the lock
    try:
        worker.start()
        worker.join(timeout=60)
    finally:
        gc.enable()
    assert done, "the pool's lock was never released: a finalizer waited for it on the thread holding it"
    pool._grow = grow
    stats = pool.stats()  # the queued release is done by the next holder at the latest
    assert stats.used_blocks == len(done[0]) and held == 2
