"""The KV memory manager: every cache of a replica in bytes, against one budget.

What a replica's KV memory holds: the P0 caches in the P0 store (each held
once; sessions and prefix requests on that P0 list its pool blocks, see
`paged_cache`), and each session's private tokens (what it typed past P0,
answer-ahead tokens). `usage` counts them, a shared P0 once however many
sessions read it.

Admission (`SessionTable.add` asks `can_admit`): each session is charged
its private bytes, at least a reserve (`session_reserve_tokens` of private
tokens: a question about to be typed and its answer), and a new session is
admitted while the shared bytes, the charges and one more reserve fit the
budget. Past it
the table evicts idle sessions, least recently used first, and re-checks;
when none is idle the open fails with RESOURCE_EXHAUSTED. A budget of 0
means no byte bound (only `max_sessions`).

Other holders of KV memory (data sessions, `headstart.data`) are charged
through the `KVHolder` protocol: each reports the bytes it holds now and
the bytes admission must count for it (what it holds plus what it has
accepted and will hold: rows buffered for ingestion, a rebuild, a query's
tail). They are admitted by the same rule (`SessionTable.admit_holder` and
`charge`), and the usage counts them (`data_bytes`), so Describe and the
replica's metrics see them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from headstart.engine.kv.state import KVState


@dataclass(frozen=True)
class KVUsage:
    """Bytes of KV memory of one replica at one moment."""

    budget_bytes: int  # 0: unbounded
    session_bytes: int  # private bytes of every session
    shared_bytes: int  # P0 caches (stored or read by a session), each once
    num_sessions: int
    charged_bytes: int  # what admission counts: shared + each session's max(private, reserve) + holders' charges
    data_bytes: int = 0  # bytes held by other holders (data sessions)
    num_data_sessions: int = 0
    # the pool blocks of the pools these caches draw from (`block_pool.PoolStats`)
    block_tokens: int = 0
    blocks_used: int = 0
    blocks_shared: int = 0
    blocks_total: int = 0

    @property
    def used_bytes(self) -> int:
        return self.session_bytes + self.shared_bytes + self.data_bytes

    @property
    def free_bytes(self) -> int | None:
        """Bytes left under the budget (None when unbounded)."""
        return None if not self.budget_bytes else max(0, self.budget_bytes - self.used_bytes)


class KVHolder(Protocol):
    """A holder of KV memory outside the typing sessions (a data session)."""

    def kv_bytes(self) -> int:
        """Bytes of KV it holds now (private: nothing shared with a stored P0)."""

    def charged_bytes(self) -> int:
        """Bytes admission counts for it: at least `kv_bytes`, plus what it has accepted and will hold."""


class KVMemory:
    """Accounts KV bytes against `budget_bytes` (0: unbounded).

    Args:
        budget_bytes: KV bytes allowed on this replica (`HEADSTART_KV_BUDGET_BYTES`).
        bytes_per_token: K+V bytes of one cached token, all layers.
        session_reserve_tokens: private tokens a new session is assumed to need.
    """

    def __init__(self, budget_bytes: int, bytes_per_token: int, session_reserve_tokens: int = 256):
        if budget_bytes < 0 or bytes_per_token <= 0 or session_reserve_tokens < 0:
            raise ValueError("budget_bytes and session_reserve_tokens must be >= 0, bytes_per_token > 0")
        self.budget_bytes = budget_bytes
        self.bytes_per_token = bytes_per_token
        self.session_reserve_tokens = session_reserve_tokens

    @property
    def session_reserve_bytes(self) -> int:
        return self.session_reserve_tokens * self.bytes_per_token

    def usage(self, session_states: Iterable[KVState | Sequence[KVState]], stored: Iterable[KVState] = (),
              holders: Iterable[KVHolder] = ()) -> KVUsage:
        """Bytes held by these sessions' caches, the stored P0 caches and the
        other holders. Counted by pool block (`block_pool`): a block several
        caches list (a P0 and the sessions on it) is counted once, as shared;
        a session's private bytes are its tokens in the blocks it allocated
        or copied (`KVState.nbytes`). A session given as several states (its
        cache and its candidates' shares of it) is charged the blocks each of
        them allocated: a candidate's copied-on-write blocks are its session's."""
        shared: dict[tuple[int, int], int] = {}  # (pool, block) -> tokens held in it, counted once
        token_bytes = 0
        stored, session_states = list(stored), list(session_states)
        for state in stored:
            for block, tokens, _ in _blocks(state):
                shared[block] = max(shared.get(block, 0), tokens)
            token_bytes = token_bytes or state.token_bytes()
        private, charged, count = 0, 0, 0
        flat: list[KVState] = []
        for states in session_states:
            count += 1
            own = 0
            for state in [states] if isinstance(states, KVState) else states:
                flat.append(state)
                for block, tokens, borrowed in _blocks(state):
                    if borrowed or block in shared:
                        shared[block] = max(shared.get(block, 0), tokens)
                    else:
                        own += tokens
                token_bytes = token_bytes or state.token_bytes()
            private += own * token_bytes
            charged += max(own * token_bytes, self.session_reserve_bytes)
        data, num_data = 0, 0
        for holder in holders:
            num_data += 1
            data += holder.kv_bytes()
            charged += holder.charged_bytes()
        shared_total = sum(shared.values()) * token_bytes
        pools = {id(s.cache.pool): s.cache.pool for s in [*stored, *flat]
                 if s.cache is not None and s.cache.pool is not None}
        blocks = [pool.stats() for pool in pools.values()]
        return KVUsage(self.budget_bytes, private, shared_total, count, shared_total + charged, data, num_data,
                       max((b.block_tokens for b in blocks), default=0), sum(b.used_blocks for b in blocks),
                       sum(b.shared_blocks for b in blocks), sum(b.total_blocks for b in blocks))

    def can_admit(self, usage: KVUsage) -> bool:
        """Whether one more session fits (module doc)."""
        return self.can_fit(usage, self.session_reserve_bytes)

    def can_fit(self, usage: KVUsage, need_bytes: int) -> bool:
        """Whether `need_bytes` more can be charged under the budget."""
        return not self.budget_bytes or usage.charged_bytes + need_bytes <= self.budget_bytes


def _blocks(state: KVState) -> list[tuple[tuple[int, int], int, bool]]:
    """((pool, block), tokens, borrowed) of a state's table (none without a cache)."""
    if state.cache is None or state.cache.pool is None:
        return []
    pool = id(state.cache.pool)
    return [((pool, block), tokens, borrowed) for block, tokens, borrowed in state.cache.block_usage()]
