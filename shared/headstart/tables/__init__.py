"""Table caches (papers/tablecache.md): foreign-key guided KV blocks per table.

Model-independent parts: the foreign-key graph (`fk_graph`), the block and
its codec (`block`, `block_codec`, `keys`), stores (`store`), the table trie
(`trie`), the device tier and its eviction policies (`device_tier`,
`eviction`), query reranking (`rerank`) and the load/compute pipeline
(`pipeline`, `transfer`).

Model-dependent parts: what each block covers and how tables are grouped
(`layout`), keys captured before rotary encoding and rotated at placement
(`rope`), the precompute job (`precompute`), cache assembly (`assemble`), the
per-process service tying them to a store and a device tier (`service`), the
engine's prefix source (`engine_source`: P0 and completions from blocks,
behind `headstart.engine.prefix_source.PrefixSource`), batch serving with
reranking and the pipeline (`batch`), and `headstart tables ...` (`cli`).
"""
