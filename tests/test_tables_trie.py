"""Table trie: leftmost-longest, non-overlapping matches and the spans left to compute."""

from __future__ import annotations

import random

import pytest

from headstart.tables.trie import Span, TableSpan, TableTrie, TrieError

TABLES = {
    "singer": [10, 11, 12],
    "singer_in_concert": [10, 11, 12, 13, 14],  # shares a prefix with singer
    "concert": [20, 21],
    "stadium": [12, 13, 30, 31],  # starts inside singer_in_concert
    "x": [21],  # inside concert
}


def _trie() -> TableTrie:
    trie = TableTrie()
    for name, ids in TABLES.items():
        trie.insert(name, ids)
    return trie


CASES = [
    ("no tables", [1, 2, 3], [], [(0, 3)]),
    ("empty prompt", [], [], []),
    ("one table, whole prompt", [20, 21], [("concert", 0, 2)], []),
    ("any order", [1, 20, 21, 2, 10, 11, 12, 3], [("concert", 1, 3), ("singer", 4, 7)], [(0, 1), (3, 4), (7, 8)]),
    ("other order", [10, 11, 12, 20, 21], [("singer", 0, 3), ("concert", 3, 5)], []),
    ("longest wins on a shared prefix", [10, 11, 12, 13, 14, 9], [("singer_in_concert", 0, 5)], [(5, 6)]),
    ("prefix of the longer one only", [10, 11, 12, 13, 9], [("singer", 0, 3)], [(3, 5)]),
    ("leftmost wins an overlap", [10, 11, 12, 13, 30, 31], [("singer", 0, 3)], [(3, 6)]),
    ("overlapped table seen when alone", [9, 12, 13, 30, 31], [("stadium", 1, 5)], [(0, 1)]),
    ("nested table inside a match", [20, 21, 21], [("concert", 0, 2), ("x", 2, 3)], []),
    ("same table twice", [20, 21, 5, 20, 21], [("concert", 0, 2), ("concert", 3, 5)], [(2, 3)]),
    ("incomplete table", [10, 11], [], [(0, 2)]),
    ("table at the end", [5, 5, 10, 11, 12], [("singer", 2, 5)], [(0, 2)]),
]


@pytest.mark.parametrize(("name", "prompt", "tables", "compute"), CASES, ids=[c[0] for c in CASES])
def test_match(name, prompt, tables, compute):
    m = _trie().match(prompt)
    assert m.tables == tuple(TableSpan(*t) for t in tables)
    assert m.compute == tuple(Span(*s) for s in compute)
    assert m.prompt_len == len(prompt)
    assert m.num_cached_tokens + m.num_compute_tokens == len(prompt)
    assert m.table_names == tuple(t[0] for t in tables)


def _reference(tables: dict[str, list[int]], prompt: list[int]) -> list[tuple[str, int, int]]:
    """Algorithm 1 as the paper writes it: longest table at p, jump, else p + 1."""
    out, p = [], 0
    while p < len(prompt):
        best = max(((len(ids), name) for name, ids in tables.items() if prompt[p : p + len(ids)] == ids), default=None)
        if best:
            out.append((best[1], p, p + best[0]))
            p += best[0]
        else:
            p += 1
    return out


@pytest.mark.parametrize("seed", range(20))
def test_matches_algorithm_1_on_random_inputs(seed):
    rng = random.Random(seed)
    tables: dict[str, list[int]] = {}
    while len(tables) < rng.randint(1, 8):
        ids = [rng.randint(0, 3) for _ in range(rng.randint(1, 6))]
        if ids not in tables.values():
            tables[f"t{len(tables)}"] = ids
    trie = TableTrie()
    for name, ids in tables.items():
        trie.insert(name, ids)
    for _ in range(20):
        prompt = [rng.randint(0, 4) for _ in range(rng.randint(0, 60))]
        got = trie.match(prompt)
        assert [(t.table, t.start, t.end) for t in got.tables] == _reference(tables, prompt)


def test_near_misses_stay_linear():
    """A prompt of near misses: Algorithm 1 as written would walk ~n * 2000 steps."""
    trie = TableTrie()
    trie.insert("long", [1] * 2000 + [2])
    trie.insert("short", [1, 3])
    m = trie.match([1] * 50_000 + [3])
    assert m.tables == (TableSpan("short", 49_999, 50_001),)
    assert m.compute == (Span(0, 49_999),)


def test_insert_rules():
    trie = _trie()
    trie.insert("singer", [10, 11, 12])  # same table, same ids: no-op
    assert len(trie) == 5 and "singer" in trie and trie.tables[0] == "singer"
    with pytest.raises(TrieError, match="no token ids"):
        trie.insert("empty", [])
    with pytest.raises(TrieError, match="other token ids"):
        trie.insert("singer", [1])
    with pytest.raises(TrieError, match="identical token ids"):
        trie.insert("alias", [20, 21])


def test_insert_after_match_rebuilds():
    trie = _trie()
    assert trie.match([7, 8]).tables == ()
    trie.insert("new", [7, 8])
    assert trie.match([7, 8]).tables == (TableSpan("new", 0, 2),)
