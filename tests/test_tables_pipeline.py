"""Load/compute pipeline: order, overlap (events, no sleeps), exceptions, early stop; transfers."""

from __future__ import annotations

import threading

import pytest
import torch

from headstart.tables.pipeline import iter_pipeline, run_pipeline
from headstart.tables.transfer import BlockTransfer
from tests.tables_blocks import fresh_scope, make_block

WAIT_S = 10.0  # only a safety net against a hang; never reached when the code works


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("table-prefetch")]


def test_results_in_order_and_loads_one_ahead():
    log: list[str] = []

    def load(b):
        log.append(f"load{b}")
        return b * 10

    def compute(b, loaded):
        # At most one batch is loaded ahead of the one computing.
        assert max(int(e[4:]) for e in log if e.startswith("load")) <= b + 1
        log.append(f"compute{b}")
        return (b, loaded)

    assert run_pipeline(range(4), load, compute) == [(0, 0), (1, 10), (2, 20), (3, 30)]
    assert [e for e in log if e.startswith("compute")] == ["compute0", "compute1", "compute2", "compute3"]
    assert [e for e in log if e.startswith("load")] == ["load0", "load1", "load2", "load3"]
    assert _prefetch_threads() == []


def test_next_load_overlaps_current_compute():
    """compute(i) waits until load(i+1) has started, and load(i+1) until compute(i) has: both run at once."""
    load_started = [threading.Event() for _ in range(4)]
    compute_started = [threading.Event() for _ in range(4)]

    def load(b):
        load_started[b].set()
        if b > 0:
            assert compute_started[b - 1].wait(WAIT_S), f"load{b} ran without compute{b - 1}"
        return b

    def compute(b, loaded):
        compute_started[b].set()
        if b + 1 < 4:
            assert load_started[b + 1].wait(WAIT_S), f"compute{b} ran without load{b + 1}"
        return loaded

    assert run_pipeline(range(4), load, compute) == [0, 1, 2, 3]


def test_load_runs_on_another_thread():
    threads = set()
    run_pipeline(range(3), lambda b: threads.add(threading.get_ident()), lambda b, _: None)
    assert threads and threading.get_ident() not in threads


def test_load_error_propagates_after_earlier_batches():
    done = []

    def load(b):
        if b == 2:
            raise KeyError("redis exploded")
        return b

    with pytest.raises(KeyError, match="redis exploded"):
        for r in iter_pipeline(range(4), load, lambda b, loaded: loaded):
            done.append(r)
    assert done == [0, 1]
    assert _prefetch_threads() == []


def test_compute_error_propagates_joins_the_loader_and_discards():
    loads, discarded = [], []

    def compute(b, loaded):
        if b == 1:
            raise RuntimeError("oom")
        return b

    with pytest.raises(RuntimeError, match="oom"):
        run_pipeline(range(5), lambda b: loads.append(b) or b, compute,
                     discard=lambda b, loaded: discarded.append((b, loaded)))
    assert loads == [0, 1, 2]  # batch 2 was prefetched while batch 1 computed; nothing after
    assert discarded == [(1, 1), (2, 2)]  # loaded, never computed: unpin them
    assert _prefetch_threads() == []


def test_failed_load_discards_nothing():
    discarded = []

    def load(b):
        if b == 1:
            raise ValueError("bad block")
        return b

    with pytest.raises(ValueError, match="bad block"):
        run_pipeline(range(3), load, lambda b, loaded: loaded, discard=lambda b, loaded: discarded.append(b))
    assert discarded == []


def _raise_oom(batch, loaded):
    raise RuntimeError("oom")


def test_discard_errors_do_not_mask_the_cause():
    def discard(b, loaded):
        raise OSError("unpin failed")

    with pytest.raises(RuntimeError, match="oom"):
        run_pipeline(range(2), lambda b: b, _raise_oom, discard=discard)


@pytest.mark.parametrize(("batches", "expected"), [([], []), ([None], [None]), ([None, 0], [None, 0])])
def test_empty_and_none_batches(batches, expected):
    assert run_pipeline(batches, lambda b: b, lambda b, loaded: loaded) == expected


def test_closing_early_stops_prefetching():
    loads, discarded = [], []
    it = iter_pipeline(range(10), lambda b: loads.append(b) or b, lambda b, loaded: loaded,
                       discard=lambda b, loaded: discarded.append(b))
    assert next(it) == 0
    it.close()
    assert loads == [0, 1]
    assert discarded == [1]
    assert _prefetch_threads() == []


def test_cpu_transfer_is_a_plain_copy():
    transfer = BlockTransfer("cpu")
    block = make_block(fresh_scope(), "singer")
    assert transfer.is_async is False and transfer(block) is block
    transfer.wait()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_transfer_is_async_and_correct():
    transfer = BlockTransfer("cuda")
    block = make_block(fresh_scope(), "singer", 64)
    on_gpu = transfer(block)
    transfer.wait()
    assert on_gpu.device.type == "cuda" and transfer.is_async
    assert torch.equal(on_gpu.keys_pre_rope.cpu(), block.keys_pre_rope)
    assert torch.equal(on_gpu.values.cpu(), block.values)
