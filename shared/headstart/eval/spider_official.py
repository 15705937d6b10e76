"""`spider-official`: the official Spider test-suite evaluator's default mode, reproduced.

Published Spider execution accuracies come from taoyds/test-suite-sql-eval
(`evaluation.py --etype exec`, without `--keep_distinct`). Before running
anything it rewrites both queries, and it compares the results exactly:

- the prediction's `value` (lower case, anywhere, even inside a name) becomes
  `1` (`evaluate()`: predictions written with a `value` placeholder);
- spaced operators are repaired in both: `> =` → `>=`, `< =` → `<=`, `! =` → `!=`;
- every `DISTINCT` token is deleted from both (sqlparse tokens, so also inside
  `COUNT(DISTINCT x)`), so `SELECT DISTINCT a` scores like `SELECT a` and
  `COUNT(DISTINCT a)` like `COUNT(a)`;
- `YEAR(CURDATE())` becomes `2020` in both when they run;
- row order matters iff the rewritten gold SQL, lower-cased, contains the
  substring `order by` (one space, no word boundary);
- rows are compared as multisets (as lists when ordered) of Python values, with
  columns permutable; floats exactly; a quick rejection first compares each
  row's values sorted by `str(value) + str(type(value))`.

Our `spider` rules keep DISTINCT and the operators as written (a prediction
that deduplicates wrongly, or does not parse, is wrong) and compare floats to 9
significant digits: they agree with the official `--keep_distinct` mode, not
with this one. See README.md beside this file.

Portions (`_quick_reject`, `_unorder_row`, `result_eq`'s steps, the rewrites)
are adapted from taoyds/test-suite-sql-eval (exec_eval.py, parse.py,
evaluation.py), Copyright the test-suite-sql-eval authors, licensed under the
Apache License 2.0; changed: typed, the column permutation search is ours
(exhaustive over columns with equal contents, where the original samples rows
to prune), and execution is our contained executor's.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from headstart.eval.records import ResultSet

_CUR_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", re.IGNORECASE)


def repair_spaced_operators(sql: str) -> str:
    """The official `postprocess`: `> =`, `< =`, `! =` with one space become `>=`, `<=`, `!=`."""
    return sql.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")


def remove_distinct(sql: str) -> str:
    """The official `remove_distinct`: drop every sqlparse token spelled `distinct`."""
    import sqlparse  # NOTE: the official tokenizer, so the deletions match token for token

    statements = sqlparse.parse(sql)
    if not statements:
        return sql
    return "".join(t.value for t in statements[0].flatten() if t.value.lower() != "distinct")


def replace_cur_year(sql: str) -> str:
    """The official `replace_cur_year` (applied to both queries when they run)."""
    return _CUR_YEAR.sub("2020", sql)


class SpiderOfficialRule:
    """The official evaluator's default mode (see the module docstring)."""

    name = "spider-official"

    def prepare_gold(self, sql: str) -> str:
        return replace_cur_year(remove_distinct(repair_spaced_operators(sql)))

    def prepare_pred(self, sql: str) -> str:
        return self.prepare_gold(sql.replace("value", "1"))

    def equal(self, gold: ResultSet, pred: ResultSet, gold_sql: str) -> bool:
        """`gold_sql` is the rewritten gold (what `prepare_gold` returned)."""
        return result_eq(list(gold.rows), list(pred.rows), order_matters="order by" in gold_sql.lower())


def result_eq(gold: list[tuple], pred: list[tuple], order_matters: bool) -> bool:
    """The official `result_eq`: is there a column permutation making `pred` equal `gold`?"""
    if not gold and not pred:
        return True
    if len(gold) != len(pred):
        return False
    width = len(gold[0])
    if len(pred[0]) != width:
        return False
    if not _quick_reject(gold, pred, order_matters):
        return False
    gold_count = Counter(gold)
    for perm in _column_permutations(gold, pred):
        permuted = pred if width == 1 else [tuple(row[i] for i in perm) for row in pred]
        if order_matters:
            if gold == permuted:
                return True
        elif set(gold) == set(permuted) and Counter(permuted) == gold_count:
            return True
    return False


def _unorder_row(row: tuple) -> tuple:
    return tuple(sorted(row, key=lambda x: str(x) + str(type(x))))


def _quick_reject(gold: list[tuple], pred: list[tuple], order_matters: bool) -> bool:
    """The official necessary condition (False rejects). NOTE: its sort key is the
    value's text, so `(2, 2.5)` and `(2.0, 2.5)` sort differently and are rejected:
    reproduced, not fixed."""
    g, p = [_unorder_row(r) for r in gold], [_unorder_row(r) for r in pred]
    return g == p if order_matters else set(g) == set(p)


def _column_permutations(gold: list[tuple], pred: list[tuple]):
    """Maps `perm` (gold column i ← pred column perm[i]) where each pred column
    holds the same multiset of values as its gold column (a necessary condition
    of both the ordered and the multiset match); identical pred columns once."""
    width = len(gold[0])
    gold_cols = [Counter(row[i] for row in gold) for i in range(width)]
    pred_cols = [[row[j] for row in pred] for j in range(width)]
    pred_counts = [Counter(col) for col in pred_cols]
    candidates = [[j for j in range(width) if pred_counts[j] == gold_cols[i]] for i in range(width)]

    def search(i: int, used: list[int]):
        if i == width:
            yield tuple(used)
            return
        tried: list[list[Any]] = []
        for j in candidates[i]:
            if j in used or pred_cols[j] in tried:
                continue
            tried.append(pred_cols[j])
            used.append(j)
            yield from search(i + 1, used)
            used.pop()

    yield from search(0, [])
