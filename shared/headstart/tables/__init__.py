"""Table caches (papers/tablecache.md): foreign-key guided KV blocks per table.

Model-independent parts: the foreign-key graph (`fk_graph`), the block and
its codec (`block`, `block_codec`, `keys`), stores (`store`), the table trie
(`trie`), the device tier and its eviction policies (`device_tier`,
`eviction`), query reranking (`rerank`) and the load/compute pipeline
(`pipeline`, `transfer`). Block precompute and the engine integration build
on these.
"""
