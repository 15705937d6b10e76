"""KV memory: every cached key and value of a process, and what is done to it without the model.

- `state.KVState`: one evolving cache (token ids, keys/values, the last logits): crop, share, copy.
- `paged_cache.PagedCache`: a cache as a block table over the pool, read in place.
- `block_pool.BlockPool`: reference-counted 64-token blocks in slabs, copy on write.
- `memory.KVMemory`: a replica's KV bytes against its budget (admission, eviction).
- `p0_store.P0Store`: each database's P0 (system prompt + schema) cache, in memory and on disk.
"""

from headstart.engine.kv.block_pool import BlockPool
from headstart.engine.kv.memory import KVHolder, KVMemory, KVUsage
from headstart.engine.kv.p0_store import P0Store, p0_key
from headstart.engine.kv.paged_cache import PagedCache
from headstart.engine.kv.state import KVState, state_from_layers

__all__ = ["BlockPool", "KVHolder", "KVMemory", "KVState", "KVUsage", "P0Store", "PagedCache", "p0_key",
           "state_from_layers"]
