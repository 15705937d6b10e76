"""Predictions made from a gold query that exercise where rule sets differ.

`scripts/check_official_spider_eval.py` scores these gold-vs-prediction pairs
with the official Spider evaluator and with ours, and the CI test replays the
official verdicts it recorded; both build the pairs with `sql_variants`, so
the pairs are the same without shipping any Spider text.

Each variant is one deterministic edit of the gold SQL; a variant whose edit
does not apply (no DISTINCT to drop, no number to change) is left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_DISTINCT = re.compile(r"(?i)\bdistinct\s+")
_FIRST_SELECT = re.compile(r"(?i)\bselect\s+(?!distinct\b)")
_COUNT_ARG = re.compile(r"(?i)\bcount\s*\(\s*(?!\*|distinct\b)")
_SPACEABLE_OP = re.compile(r"(>=|<=|!=)")
_GREATER = re.compile(r"(?<![<>!=])>(?!=)")
_NUMBER = re.compile(r"(?<![\w.'\"])(\d+)(?![\w.])")
_STRING = re.compile(r"'([^']*)'|\"([^\"]*)\"")
_DIRECTION = re.compile(r"(?i)\b(asc|desc)\b")
_ORDER_BY_CLAUSE = re.compile(r"(?i)\s+order\s+by\s+.*?(?=\s+limit\b|\)|$)")
_LIMIT = re.compile(r"(?i)\blimit\s+(\d+)")
_SELECT_LIST = re.compile(r"(?is)^\s*select\s+(.*?)\s+from\b")


def drop_distinct(sql: str) -> str:
    """The first DISTINCT deleted (`SELECT DISTINCT a`, `COUNT(DISTINCT a)`)."""
    return _DISTINCT.sub("", sql, count=1)


def add_distinct(sql: str) -> str:
    """DISTINCT added to the first SELECT that lacks one."""
    return _FIRST_SELECT.sub(lambda m: m.group(0) + "DISTINCT ", sql, count=1)


def count_distinct(sql: str) -> str:
    """`COUNT(x)` → `COUNT(DISTINCT x)` for the first count of a column."""
    return _COUNT_ARG.sub(lambda m: m.group(0) + "DISTINCT ", sql, count=1)


def spaced_operator(sql: str) -> str:
    """`>=` → `> =` (and `<=`, `!=`): what some models print; else `>` → `> =`."""
    if _SPACEABLE_OP.search(sql):
        return _SPACEABLE_OP.sub(lambda m: m.group(1)[0] + " =", sql, count=1)
    return _GREATER.sub("> =", sql, count=1)


def number_changed(sql: str) -> str:
    """The first number outside quotes plus one."""
    return _NUMBER.sub(lambda m: str(int(m.group(1)) + 1), sql, count=1)


def string_changed(sql: str) -> str:
    """The first string literal with an `x` appended."""
    return _STRING.sub(lambda m: m.group(0)[:-1] + "x" + m.group(0)[-1], sql, count=1)


def value_placeholder(sql: str) -> str:
    """The first number replaced by the word `value` (a placeholder some systems print)."""
    return _NUMBER.sub("value", sql, count=1)


def direction_flipped(sql: str) -> str:
    """The first ASC/DESC flipped."""
    return _DIRECTION.sub(lambda m: "DESC" if m.group(1).lower() == "asc" else "ASC", sql, count=1)


def order_dropped(sql: str) -> str:
    """The first ORDER BY clause deleted (its LIMIT kept)."""
    return _ORDER_BY_CLAUSE.sub("", sql, count=1)


def limit_changed(sql: str) -> str:
    """LIMIT n → LIMIT n+1."""
    return _LIMIT.sub(lambda m: f"LIMIT {int(m.group(1)) + 1}", sql, count=1)


def columns_swapped(sql: str) -> str:
    """The first two items of the outer SELECT list swapped (same answer, other column order)."""
    match = _SELECT_LIST.match(sql)
    if match is None:
        return sql
    items = _split_top_level(match.group(1))
    if len(items) < 2:
        return sql
    items[0], items[1] = items[1], items[0]
    return sql[: match.start(1)] + ", ".join(i.strip() for i in items) + sql[match.end(1):]


def misspelled(sql: str) -> str:
    """SELECT → SELEC: a prediction that does not run."""
    return re.sub(r"(?i)\bselect\b", "SELEC", sql, count=1)


VARIANTS: dict[str, Callable[[str], str]] = {
    "gold": lambda sql: sql,
    "drop_distinct": drop_distinct,
    "add_distinct": add_distinct,
    "count_distinct": count_distinct,
    "spaced_operator": spaced_operator,
    "number_changed": number_changed,
    "string_changed": string_changed,
    "value_placeholder": value_placeholder,
    "direction_flipped": direction_flipped,
    "order_dropped": order_dropped,
    "limit_changed": limit_changed,
    "columns_swapped": columns_swapped,
    "misspelled": misspelled,
}


def one_line(sql: str) -> str:
    """Whitespace runs as one space: the official files hold one query per line."""
    return " ".join(sql.split())


def sql_variants(gold_sql: str) -> dict[str, str]:
    """{variant name: prediction} for the edits that change `gold_sql` (and `gold` itself)."""
    gold = one_line(gold_sql)
    out = {}
    for name, edit in VARIANTS.items():
        pred = edit(gold)
        if name == "gold" or pred != gold:
            out[name] = pred
    return out


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items
