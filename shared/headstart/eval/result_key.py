"""The canonical key of a query's result: equal answers share it, whatever their spelling.

Values are the evaluator's canonical values (`compare.canonical_value`:
NULL, 0/1 booleans, floats rounded to 9 significant digits), so the key
agrees with how `headstart eval` compares results. Execution-checked
answers (`headstart.candidates`) group candidates by it. Without a gold query to
say whether order matters, rows are a multiset; columns may come in any
order (Spider's rule), so they are put in a canonical order first. Two
empty results share a key whatever their columns, as the evaluator counts
them equal. sha256 over the repr, never Python's `hash()`.
"""

from __future__ import annotations

import hashlib

from headstart.eval.compare import canonical_rows
from headstart.eval.records import ResultSet


def _sort_key(value) -> tuple[str, str]:
    """Orders values of mixed types (None, ints, strings, bytes) without comparing across types."""
    return type(value).__name__, repr(value)


def result_key(result: ResultSet) -> str:
    """The hex sha256 of `result`'s canonical form (module doc)."""
    rows = canonical_rows(result)
    if not rows:
        return hashlib.sha256(b"empty").hexdigest()
    width = len(rows[0])
    columns = [sorted((row[i] for row in rows), key=_sort_key) for i in range(width)]
    order = sorted(range(width), key=lambda i: [_sort_key(v) for v in columns[i]])
    permuted = sorted((tuple(row[i] for i in order) for row in rows), key=lambda row: [_sort_key(v) for v in row])
    return hashlib.sha256(repr(permuted).encode()).hexdigest()
