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
