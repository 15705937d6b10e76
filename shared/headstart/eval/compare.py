"""Decide whether a predicted result equals the gold result.

Three rule sets, picked by name from `RULES` once per run:
- `spider`: the test-suite semantics of Spider (Zhong et al. 2020): rows form a
  multiset (duplicates count); row order matters only when the gold SQL has
  ORDER BY; columns may be permuted (the prediction may list them in another
  order); two empty results are equal whatever their columns.
- `bird`: BIRD's official check, `set(pred_rows) == set(gold_rows)`: duplicates
  and row order are ignored, column order matters.
- `spider-official`: what published Spider numbers use, the official
  test-suite evaluator's default mode, which deletes every DISTINCT and repairs
  spaced operators before running (`spider_official.py`).

Both compare canonical values: NULL equals NULL, booleans are 0/1, Decimals
are floats, and floats are rounded to 9 significant digits. The rounding
absorbs float noise (0.1 + 0.2, an AVG summed in another order, PostgreSQL's
numeric vs SQLite's double) that is not a different answer; NOTE: both
official scripts compare floats exactly, so this tolerance is our choice.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import Counter
from decimal import Decimal
from typing import Any, Iterator, Protocol

from headstart.eval.errors import ConfigError
from headstart.eval.records import ResultSet
from headstart.eval.spider_official import SpiderOfficialRule

FLOAT_SIGNIFICANT_DIGITS = 9
_NAN = ("NaN",)  # a float NaN equals itself here; a tuple cannot collide with a row value
_STRING_LITERAL = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


class ResultComparator(Protocol):
    """A rule set: called once per scored question with both results."""

    name: str

    def prepare_gold(self, sql: str) -> str:
        """The gold SQL as this rule set runs it (called once per question, before it runs)."""
        ...

    def prepare_pred(self, sql: str) -> str:
        """The extracted prediction as this rule set runs it (called before it runs)."""
        ...

    def equal(self, gold: ResultSet, pred: ResultSet, gold_sql: str) -> bool:
        """True when `pred` counts as the same answer as `gold` (the result of the prepared `gold_sql`)."""
        ...


class RunsSqlAsWritten:
    """Rules that run both queries exactly as written."""

    def prepare_gold(self, sql: str) -> str:
        return sql

    def prepare_pred(self, sql: str) -> str:
        return sql


def canonical_value(value: Any) -> Any:
    """A hashable value that two databases' spellings of the same answer share."""
    if value is None or isinstance(value, (str, int)) and not isinstance(value, bool):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, Decimal)):
        number = float(value)
        if math.isnan(number):
            return _NAN
        if math.isinf(number):
            return number
        number = float(f"{number:.{FLOAT_SIGNIFICANT_DIGITS}g}")
        return int(number) if number.is_integer() and abs(number) < 2**53 else number
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return tuple(canonical_value(v) for v in value)
    return value


def canonical_rows(result: ResultSet) -> list[tuple]:
    return [tuple(canonical_value(v) for v in row) for row in result.rows]


def gold_orders_rows(gold_sql: str) -> bool:
    """Spider's rule: row order matters iff the gold SQL says ORDER BY (outside string literals)."""
    return bool(_ORDER_BY.search(_STRING_LITERAL.sub("''", gold_sql)))


class SpiderRule(RunsSqlAsWritten):
    """Spider test-suite semantics (multiset rows, ORDER BY-aware, columns permutable)."""

    name = "spider"

    def equal(self, gold: ResultSet, pred: ResultSet, gold_sql: str) -> bool:
        gold_rows, pred_rows = canonical_rows(gold), canonical_rows(pred)
        if not gold_rows and not pred_rows:
            return True
        if len(gold_rows) != len(pred_rows):
            return False
        width = len(gold_rows[0])
        if any(len(row) != width for row in pred_rows):
            return False
        ordered = gold_orders_rows(gold_sql)
        gold_count = None if ordered else Counter(gold_rows)
        for perm in column_permutations(gold_rows, pred_rows):
            permuted = [tuple(row[j] for j in perm) for row in pred_rows]
            if ordered and permuted == gold_rows:
                return True
            if not ordered and Counter(permuted) == gold_count:
                return True
        return False


class BirdRule(RunsSqlAsWritten):
    """BIRD semantics: the sets of rows are equal (no duplicates, no order, fixed columns)."""

    name = "bird"

    def equal(self, gold: ResultSet, pred: ResultSet, gold_sql: str) -> bool:
        return set(canonical_rows(gold)) == set(canonical_rows(pred))


def column_permutations(gold_rows: list[tuple], pred_rows: list[tuple]) -> Iterator[tuple[int, ...]]:
    """Yield maps `perm` (gold column i ← pred column perm[i]) worth trying.

    A pred column is a candidate for gold column i only when it holds the same
    multiset of values; among candidates with identical contents only one is
    tried (swapping equal columns changes nothing), so wide results with many
    alike columns do not explode. The identity map comes first.
    """
    width = len(gold_rows[0])
    gold_cols = [[row[i] for row in gold_rows] for i in range(width)]
    pred_cols = [[row[j] for row in pred_rows] for j in range(width)]
    pred_counts = [Counter(col) for col in pred_cols]
    candidates = []
    for i, col in enumerate(gold_cols):
        wanted = Counter(col)
        matches = [j for j in range(width) if pred_counts[j] == wanted]
        matches.sort(key=lambda j: j != i)
        candidates.append(matches)

    def search(i: int, used: list[int]) -> Iterator[tuple[int, ...]]:
        if i == width:
            yield tuple(used)
            return
        tried: list[list] = []
        for j in candidates[i]:
            if j in used or pred_cols[j] in tried:
                continue
            tried.append(pred_cols[j])
            used.append(j)
            yield from search(i + 1, used)
            used.pop()

    yield from search(0, [])


RULES: dict[str, ResultComparator] = {
    "spider": SpiderRule(), "bird": BirdRule(), "spider-official": SpiderOfficialRule(),
}


def get_rule(name: str) -> ResultComparator:
    """The rule set called `name`; ConfigError listing the valid names otherwise."""
    try:
        return RULES[name]
    except KeyError:
        raise ConfigError(f"unknown comparison rules {name!r}; valid: {', '.join(sorted(RULES))}") from None
