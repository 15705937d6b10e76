"""Table trie: find which tables' token sequences occur in a prompt.

Implements the matching of the paper's Algorithm 1: scan the prompt from
position p; if one or more tables start at p, take the *longest* one, record
it and jump to its end; otherwise step to p + 1. Every gap between matched
tables is a span still to compute.

Overlaps: matches never overlap. At a position where several tables start,
the longest wins; once a table is taken, tables starting inside it are not
seen even if they are longer or end later (leftmost first, then longest). A
table that occurs twice is reported twice.

Complexity: Algorithm 1 as written re-walks the trie from every position and
is O(n * longest table) on a prompt full of near-misses. Here an
Aho-Corasick automaton over the *reversed* table sequences, run once over the
reversed prompt, yields the longest table starting at each position in O(n)
total; the greedy jump scan is then O(n) too. Building is O(total table
tokens). Token ids are compared exactly, so a table block is only found when
the prompt renders and tokenizes the table exactly as the precompute did.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


class TrieError(ValueError):
    """A table could not be inserted (empty, or its tokens clash with another table)."""


@dataclass(frozen=True)
class Span:
    """Half-open range [start, end) of prompt positions."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class TableSpan:
    """Table `table` occupies prompt positions [start, end)."""

    table: str
    start: int
    end: int


@dataclass(frozen=True)
class TrieMatch:
    """Tables found in a prompt and the spans left to compute, both in prompt order."""

    tables: tuple[TableSpan, ...]
    compute: tuple[Span, ...]
    prompt_len: int

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(t.table for t in self.tables)

    @property
    def num_cached_tokens(self) -> int:
        return sum(t.end - t.start for t in self.tables)

    @property
    def num_compute_tokens(self) -> int:
        return sum(s.length for s in self.compute)


class TableTrie:
    """Trie of table token sequences with an O(n) `match` (see module docstring).

    `insert` every table of a scope once (precompute or load time), then call
    `match` for each incoming prompt. Inserting after a match rebuilds the
    automaton lazily at the next match. Concurrent `match` calls are safe once
    built; `insert` must not run concurrently with anything (build a new trie
    and swap it in instead).
    """

    def __init__(self) -> None:
        self._tables: dict[str, tuple[int, ...]] = {}
        self._owner: dict[tuple[int, ...], str] = {}
        self._built = False
        # Automaton over reversed sequences; node 0 is the root.
        self._children: list[dict[int, int]] = []
        self._fail: list[int] = []
        self._best_len: list[int] = []  # longest table that is a suffix of the node's string
        self._best_table: list[str] = []

    def __len__(self) -> int:
        return len(self._tables)

    def __contains__(self, table: str) -> bool:
        return table in self._tables

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(self._tables)

    def insert(self, table: str, token_ids: Sequence[int]) -> None:
        """Add a table's token ids; re-inserting the same (table, ids) is a no-op.

        Raises:
            TrieError: empty ids, the table already has other ids, or another
                table has exactly these ids (a match could not tell them apart).
        """
        ids = tuple(int(t) for t in token_ids)
        if not ids:
            raise TrieError(f"table {table!r}: no token ids")
        old = self._tables.get(table)
        if old is not None and old != ids:
            raise TrieError(f"table {table!r} is already in the trie with other token ids")
        owner = self._owner.get(ids)
        if owner is not None and owner != table:
            raise TrieError(f"tables {owner!r} and {table!r} have identical token ids")
        self._tables[table] = ids
        self._owner[ids] = table
        self._built = False

    def match(self, prompt_ids: Sequence[int]) -> TrieMatch:
        """Find tables in `prompt_ids` (leftmost, then longest, no overlaps)."""
        if not self._built:
            self._build()
        n = len(prompt_ids)
        longest_at, table_at = self._longest_starting_at(prompt_ids)
        tables: list[TableSpan] = []
        compute: list[Span] = []
        gap_start = p = 0
        while p < n:
            length = longest_at[p]
            if length == 0:
                p += 1
                continue
            if gap_start < p:
                compute.append(Span(gap_start, p))
            tables.append(TableSpan(table_at[p], p, p + length))
            p += length
            gap_start = p
        if gap_start < n:
            compute.append(Span(gap_start, n))
        return TrieMatch(tuple(tables), tuple(compute), n)

    def _longest_starting_at(self, prompt_ids: Sequence[int]) -> tuple[list[int], list[str]]:
        """Length and name of the longest table starting at each position (0, "": none).

        A table starting at p in the prompt is a
        table ending at n-1-p in the reversed prompt; the automaton state after
        each reversed token gives the longest such table in O(1) amortized.
        """
        n = len(prompt_ids)
        longest = [0] * n
        table_at = [""] * n
        children, fail = self._children, self._fail
        state = 0
        for i in range(n - 1, -1, -1):
            tok = int(prompt_ids[i])
            while state and tok not in children[state]:
                state = fail[state]
            state = children[state].get(tok, 0)
            if self._best_len[state]:
                longest[i] = self._best_len[state]
                table_at[i] = self._best_table[state]
        return longest, table_at

    def _build(self) -> None:
        """Insert reversed sequences, then set failure links and best matches in BFS order."""
        children: list[dict[int, int]] = [{}]
        depth = [0]
        terminal: list[str | None] = [None]
        for table, ids in self._tables.items():
            node = 0
            for tok in reversed(ids):
                nxt = children[node].get(tok)
                if nxt is None:
                    nxt = len(children)
                    children[node][tok] = nxt
                    children.append({})
                    depth.append(depth[node] + 1)
                    terminal.append(None)
                node = nxt
            terminal[node] = table
        fail = [0] * len(children)
        best_len = [0] * len(children)
        best_table = [""] * len(children)
        queue = deque(children[0].values())
        while queue:
            node = queue.popleft()
            if terminal[node] is not None:
                best_len[node], best_table[node] = depth[node], terminal[node]
            else:
                best_len[node], best_table[node] = best_len[fail[node]], best_table[fail[node]]
            for tok, child in children[node].items():
                f = fail[node]
                while f and tok not in children[f]:
                    f = fail[f]
                fail[child] = children[f].get(tok, 0) if node else 0
                queue.append(child)
        self._children, self._fail = children, fail
        self._best_len, self._best_table = best_len, best_table
        self._built = True
