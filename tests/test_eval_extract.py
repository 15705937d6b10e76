"""SQL extraction from messy model outputs."""

from __future__ import annotations

import pytest

from headstart.eval.extract import extract_sql, split_statements

CASES = [
    ("bare", "SELECT name FROM singer", "SELECT name FROM singer"),
    ("trailing semicolon", "SELECT name FROM singer;", "SELECT name FROM singer"),
    ("fence with sql tag", "```sql\nSELECT name FROM singer;\n```", "SELECT name FROM singer"),
    ("fence without tag", "```\nSELECT name FROM singer\n```", "SELECT name FROM singer"),
    ("fence with sqlite tag", "```sqlite\nSELECT 1\n```", "SELECT 1"),
    ("prose before fence", "Here is the query:\n```sql\nSELECT a FROM t\n```", "SELECT a FROM t"),
    ("prose after fence", "```sql\nSELECT a FROM t\n```\nThis returns every a.", "SELECT a FROM t"),
    ("prose around bare SQL", "Sure! The query is:\nSELECT a FROM t;\nIt lists a.", "SELECT a FROM t"),
    ("prose after, no semicolon", "SELECT a\nFROM t\n\nThis query lists a.", "SELECT a\nFROM t"),
    ("explanation line", "SELECT a\nFROM t\nExplanation: lists a", "SELECT a\nFROM t"),
    ("multiple statements", "SELECT a FROM t; SELECT b FROM u;", "SELECT a FROM t"),
    ("DROP after a query", "SELECT a FROM t; DROP TABLE t", "SELECT a FROM t"),
    ("semicolon inside a string", "SELECT a FROM t WHERE s = 'x;y'; SELECT 2", "SELECT a FROM t WHERE s = 'x;y'"),
    ("escaped quote", "SELECT 'it''s;' FROM t; x", "SELECT 'it''s;' FROM t"),
    ("im_end remnant", "SELECT a FROM t<|im_end|>\n<|im_start|>user\nmore", "SELECT a FROM t"),
    ("endoftext remnant", "```sql\nSELECT a FROM t\n```<|endoftext|>garbage", "SELECT a FROM t"),
    ("unterminated fence", "```sql\nSELECT a FROM t WHERE", "SELECT a FROM t WHERE"),
    ("python fence then sql fence", "```python\nprint(1)\n```\n```sql\nSELECT 1\n```", "SELECT 1"),
    ("inline code span", "The answer is `SELECT count(*) FROM t`.", "SELECT count(*) FROM t"),
    ("SQL: label", "SQL: SELECT a FROM t", "SELECT a FROM t"),
    ("lower-case select", "select a from t", "select a from t"),
    ("WITH query", "```sql\nWITH x AS (SELECT 1) SELECT * FROM x;\n```", "WITH x AS (SELECT 1) SELECT * FROM x"),
    ("multi-line kept", "```sql\nSELECT a,\n  b\nFROM t\nWHERE c = 1\n```", "SELECT a,\n  b\nFROM t\nWHERE c = 1"),
    ("alias line starting with i", "SELECT\n  i.name\nFROM items AS i", "SELECT\n  i.name\nFROM items AS i"),
    ("comment after query", "SELECT a FROM t; -- done", "SELECT a FROM t"),
    ("no SQL at all", "  I cannot answer that.  ", "I cannot answer that."),
    ("empty", "", ""),
]


@pytest.mark.parametrize(("text", "sql"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_extract_sql(text: str, sql: str) -> None:
    assert extract_sql(text) == sql


@pytest.mark.parametrize(
    ("sql", "statements"),
    [
        ("SELECT 1", ["SELECT 1"]),
        ("SELECT 1; SELECT 2;", ["SELECT 1", "SELECT 2"]),
        ("SELECT ';' ; SELECT \"a;b\"", ["SELECT ';'", 'SELECT "a;b"']),
        ("SELECT 1 -- x; y\n", ["SELECT 1 -- x; y"]),
        ("SELECT /* ; */ 1", ["SELECT /* ; */ 1"]),
        (";;  ; -- only a comment", []),
        ("SELECT [a;b] FROM t", ["SELECT [a;b] FROM t"]),
    ],
)
def test_split_statements(sql: str, statements: list[str]) -> None:
    assert split_statements(sql) == statements


# A SELECT in the middle of the text is a subquery or the second half of a
# compound query: extracting it would score a broken answer as right.
NOT_FROM_THE_MIDDLE = [
    ("subquery after a prose label",
     "Answer: select name from t where id in (SELECT id FROM u)",
     "select name from t where id in (SELECT id FROM u)"),
    ("subquery, lower-case outer, upper-case inner on its own line",
     "The query is select name from t where id in (\nSELECT id FROM u)",
     "select name from t where id in (\nSELECT id FROM u)"),
    ("CTE body is not the start", "Answer: with x as (SELECT 1 AS a) select a from x",
     "with x as (SELECT 1 AS a) select a from x"),
    ("misspelled first keyword before UNION", "SELEC name FROM a UNION SELECT name FROM b",
     "SELEC name FROM a UNION SELECT name FROM b"),
    ("misspelled first keyword before UNION ALL on a new line", "SELEC name FROM a\nUNION ALL\nSELECT name FROM b",
     "SELEC name FROM a\nUNION ALL\nSELECT name FROM b"),
    ("misspelled before INTERSECT (parenthesised)", "SELCT a FROM t INTERSECT (SELECT a FROM u)",
     "SELCT a FROM t INTERSECT (SELECT a FROM u)"),
    ("misspelled before EXCEPT", "Answer: selct a from t except select a from u",
     "Answer: selct a from t except select a from u"),
    ("compound query kept whole", "SELECT a FROM t UNION SELECT a FROM u", "SELECT a FROM t UNION SELECT a FROM u"),
    ("whole query in parentheses (its closing one stays, as before)", "Answer: (SELECT a FROM t)", "SELECT a FROM t)"),
    ("prose with before a parenthesised query", "Sure, with pleasure:\n(SELECT a FROM t)", "SELECT a FROM t)"),
    ("closed prose parentheses", "Here (roughly) it is: SELECT a FROM t", "SELECT a FROM t"),
    ("prose 'select' before the query", "I will select rows: SELECT a FROM t WHERE b IN (SELECT b FROM u)",
     "SELECT a FROM t WHERE b IN (SELECT b FROM u)"),
    ("apostrophe in prose", "Here's the query: SELECT a FROM t", "SELECT a FROM t"),
]


@pytest.mark.parametrize(("text", "sql"), [c[1:] for c in NOT_FROM_THE_MIDDLE], ids=[c[0] for c in NOT_FROM_THE_MIDDLE])
def test_extract_sql_never_starts_inside_a_statement(text: str, sql: str) -> None:
    assert extract_sql(text) == sql
