"""Exact match: the secondary metric, normalised SQL text equality.

Execution accuracy can credit a query that is right by accident (an empty
result equals an empty result); exact match is strict in the other direction
(a different but equivalent query fails). Both go in the report.
"""

from __future__ import annotations

from headstart.eval.sqlnorm import normalize_sql


def exact_match(gold_sql: str, pred_sql: str, known_names: frozenset[str] | None = None) -> bool:
    """True when both queries normalise to the same text (see `sqlnorm.normalize_sql`).

    `known_names` (the database's lower-cased table and column names) lets a
    double-quoted string and a single-quoted one compare equal, as SQLite
    treats them.
    """
    if not pred_sql.strip():
        return False
    return normalize_sql(gold_sql, known_names) == normalize_sql(pred_sql, known_names)
