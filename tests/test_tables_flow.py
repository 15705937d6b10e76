"""The model-independent parts together on CPU: trie -> rerank -> pipeline(store -> device tier)."""

from __future__ import annotations

from headstart.tables.device_tier import DeviceTier
from headstart.tables.pipeline import run_pipeline
from headstart.tables.rerank import rerank
from headstart.tables.store import open_store
from headstart.tables.trie import TableTrie
from tests.tables_blocks import block_bytes, fresh_scope, make_block

TABLE_TOKENS = {"singer": 3, "concert": 2, "stadium": 4, "song": 2, "band": 3}


def test_requests_flow_through_the_tiers():
    scope = fresh_scope()
    store = open_store("memory://")
    trie = TableTrie()
    for seed, (table, n) in enumerate(TABLE_TOKENS.items(), start=1):
        block = make_block(scope, table, n, seed=seed)
        store.put(block)
        trie.insert(table, block.token_ids)
    ids = {t: list(store.get(scope.block_id(t)).token_ids) for t in TABLE_TOKENS}
    q = [900, 901]  # the question: never a table
    prompts = [
        ids["singer"] + ids["concert"] + q,
        ids["stadium"] + q,
        ids["concert"] + ids["singer"] + q,  # any order
        ids["song"] + ids["band"] + q,
        ids["stadium"] + q + ids["singer"][:2],  # a cut table is computed
    ]
    matches = [trie.match(p) for p in prompts]
    order = rerank([set(m.table_names) for m in matches], max_delay=2)
    assert order == [0, 2, 1, 4, 3]

    tier = DeviceTier(4 * block_bytes(4), policy="lru", device="meta")

    def load(i):
        blocks = []
        for name in matches[i].table_names:
            key = scope.block_id(name).key
            block = tier.get(key, pin=True) or tier.admit(store.get(scope.block_id(name)), pin=True)
            blocks.append(block)
        return blocks

    def compute(i, blocks):
        assert all(b.device.type == "meta" and tier.pin_count(b.key) > 0 for b in blocks)
        for b in blocks:
            tier.unpin(b.key)
        return i, sum(b.num_tokens for b in blocks), matches[i].num_compute_tokens

    results = run_pipeline(order, load, compute)
    assert results == [(0, 5, 2), (2, 5, 2), (1, 4, 2), (4, 4, 4), (3, 5, 2)]
    assert tier.protected_bytes == 0 and tier.num_hits + tier.num_misses == 8
