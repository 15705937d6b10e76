"""The two comparison rules on crafted result pairs: order, duplicates, NULLs, floats, columns."""

from __future__ import annotations

from decimal import Decimal

import pytest

from headstart.eval.compare import RULES, canonical_value, column_permutations, get_rule, gold_orders_rows
from headstart.eval.errors import ConfigError
from headstart.eval.records import ResultSet


def rs(*rows: tuple, columns: tuple[str, ...] | None = None) -> ResultSet:
    width = len(rows[0]) if rows else 1
    return ResultSet(columns or tuple(f"c{i}" for i in range(width)), tuple(rows))


UNORDERED = "SELECT a, b FROM t"
ORDERED = "SELECT a, b FROM t ORDER BY a"

# (case, gold, pred, gold_sql, spider verdict, bird verdict)
CASES = [
    ("identical", rs((1, "x"), (2, "y")), rs((1, "x"), (2, "y")), UNORDERED, True, True),
    ("rows reordered, no ORDER BY", rs((1, "x"), (2, "y")), rs((2, "y"), (1, "x")), UNORDERED, True, True),
    ("rows reordered, gold has ORDER BY", rs((1, "x"), (2, "y")), rs((2, "y"), (1, "x")), ORDERED, False, True),
    ("same order, gold has ORDER BY", rs((1, "x"), (2, "y")), rs((1, "x"), (2, "y")), ORDERED, True, True),
    ("ORDER BY only inside a string", rs((1,), (2,)), rs((2,), (1,)), "SELECT a FROM t WHERE s = 'order by'", True, True),
    ("duplicate missing", rs((1,), (1,), (2,)), rs((1,), (2,)), UNORDERED, False, True),
    ("duplicate extra", rs((1,), (2,)), rs((1,), (2,), (2,)), UNORDERED, False, True),
    ("duplicates moved", rs((1,), (1,), (2,)), rs((1,), (2,), (2,)), UNORDERED, False, True),
    ("NULL equals NULL", rs((None, 1), (2, None)), rs((2, None), (None, 1)), UNORDERED, True, True),
    ("NULL is not 0", rs((None,),), rs((0,),), UNORDERED, False, False),
    ("NULL is not ''", rs((None,),), rs(("",),), UNORDERED, False, False),
    ("float noise", rs((0.3,),), rs((0.1 + 0.2,),), UNORDERED, True, True),
    ("float vs int", rs((3,),), rs((3.0,),), UNORDERED, True, True),
    ("decimal vs float", rs((Decimal("2.50"),),), rs((2.5,),), UNORDERED, True, True),
    ("real float difference", rs((0.3,),), rs((0.3001,),), UNORDERED, False, False),
    ("rounded average is a different answer", rs((2.3333333333,),), rs((2.33,),), UNORDERED, False, False),
    ("columns permuted", rs((1, "x"), (2, "y")), rs(("x", 1), ("y", 2)), UNORDERED, True, False),
    ("columns permuted, ordered", rs((1, "x"), (2, "y")), rs(("x", 1), ("y", 2)), ORDERED, True, False),
    ("columns permuted but rows mismatched", rs((1, "x"), (2, "y")), rs(("y", 1), ("x", 2)), UNORDERED, False, False),
    ("extra column", rs((1,), (2,)), rs((1, "x"), (2, "y")), UNORDERED, False, False),
    ("missing column", rs((1, "x"),), rs((1,),), UNORDERED, False, False),
    ("both empty, different columns", ResultSet(("a",), ()), ResultSet(("a", "b"), ()), UNORDERED, True, True),
    ("empty vs not", ResultSet(("a",), ()), rs((1,),), UNORDERED, False, False),
    ("case matters in strings", rs(("Paris",),), rs(("paris",),), UNORDERED, False, False),
    ("bool vs int", rs((1,),), rs((True,),), UNORDERED, True, True),
    ("NaN equals NaN", rs((float("nan"),),), rs((float("nan"),),), UNORDERED, True, True),
]


@pytest.mark.parametrize(("gold", "pred", "gold_sql", "spider", "bird"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rules_on_crafted_pairs(gold: ResultSet, pred: ResultSet, gold_sql: str, spider: bool, bird: bool) -> None:
    assert RULES["spider"].equal(gold, pred, gold_sql) is spider
    assert RULES["bird"].equal(gold, pred, gold_sql) is bird


@pytest.mark.parametrize(
    ("gold_sql", "ordered"),
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order  by a desc limit 1", True),
        ("SELECT a FROM t", False),
        ("SELECT a FROM t WHERE name = 'order by'", False),
        ('SELECT a FROM t WHERE name = "x ORDER BY y"', False),
        ("SELECT border_by FROM t", False),
    ],
)
def test_gold_orders_rows(gold_sql: str, ordered: bool) -> None:
    assert gold_orders_rows(gold_sql) is ordered


@pytest.mark.parametrize(
    ("gold", "pred", "perms"),
    [
        ([(1, "x")], [(1, "x")], [(0, 1)]),
        ([(1, "x")], [("x", 1)], [(1, 0)]),
        # identical pred columns are interchangeable: one map is enough
        ([(1, 1, 2)], [(1, 1, 2)], [(0, 1, 2)]),
        ([(1, 2)], [(3, 4)], []),
    ],
)
def test_column_permutations(gold: list[tuple], pred: list[tuple], perms: list[tuple[int, ...]]) -> None:
    assert list(column_permutations(gold, pred)) == perms


def test_wide_alike_columns_do_not_explode() -> None:
    gold = [tuple([1] * 12), tuple([2] * 12)]
    assert len(list(column_permutations(gold, gold))) == 1
    assert RULES["spider"].equal(rs(*gold), rs(*gold), UNORDERED)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [(None, None), (True, 1), (2.0, 2), (0.1 + 0.2, 0.3), (Decimal("1.50"), 1.5), (b"ab", b"ab"), ("x", "x")],
)
def test_canonical_value(value: object, canonical: object) -> None:
    assert canonical_value(value) == canonical


def test_unknown_rule_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="valid: bird, spider"):
        get_rule("test-suite")
