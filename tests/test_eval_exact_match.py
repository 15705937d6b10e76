"""Exact match of normalised SQL (sqlglot): case, quotes, spacing, semicolons."""

from __future__ import annotations

import pytest

from headstart.eval.exact_match import exact_match
from headstart.eval.sqlnorm import normalize_sql

SINGER = frozenset({"singer", "name", "citizenship", "age", "singer_id"})


@pytest.mark.parametrize(
    ("gold", "pred", "names", "equal"),
    [
        ("SELECT count(*) FROM singer", "select COUNT(*) from SINGER;", None, True),
        ("SELECT name FROM singer", "SELECT  name\n FROM   singer", None, True),
        ('SELECT name FROM singer WHERE citizenship = "France"', "SELECT name FROM singer WHERE citizenship = 'France'", SINGER, True),
        # without the database's names, "France" could be a column: no match
        ('SELECT name FROM singer WHERE citizenship = "France"', "SELECT name FROM singer WHERE citizenship = 'France'", None, False),
        ('SELECT "name" FROM singer', "SELECT name FROM singer", SINGER, True),
        ("SELECT T1.name FROM singer AS T1", "SELECT t1.name FROM singer t1", None, True),
        ("SELECT name FROM singer WHERE citizenship = 'France'", "SELECT name FROM singer WHERE citizenship = 'france'", None, False),
        ("SELECT name FROM singer ORDER BY age", "SELECT name FROM singer ORDER BY age DESC", None, False),
        ("SELECT name FROM singer", "SELECT singer.name FROM singer", None, False),
        ("SELECT name FROM singer", "", None, False),
        ("SELECT name FROM singer WHERE", "select name from singer where", None, True),  # unparsable: text fallback
    ],
)
def test_exact_match(gold: str, pred: str, names: frozenset[str] | None, equal: bool) -> None:
    assert exact_match(gold, pred, names) is equal


def test_normalized_form() -> None:
    assert normalize_sql('select T1.Name from Singer as T1 where T1.Age > 20 and Citizenship = "France";', SINGER) == (
        "SELECT t1.name FROM singer AS t1 WHERE t1.age > 20 AND citizenship = 'France'"
    )
