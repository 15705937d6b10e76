"""A plan's rows as forwards: split by the token budget, each run by its runner.

The worker hands the rows its plan's steps prepared to `run_rows`: they run
as packed forwards (`ModelRunner.extend_rows`, one row or several), split
into forwards that fit the token budget in the plan's order (the most
urgent first). Rows leave a forward between layers one by one: a row whose
`should_abort` asks is dropped there with its cache untouched and the
others go on.
"""

from __future__ import annotations

from headstart.engine.runner.rows import Row, RowResult


def pack_forwards(rows: list[Row], max_tokens: int) -> list[list[Row]]:
    """Split rows (most urgent first) into forwards of at most `max_tokens`
    new tokens each (at least one row per forward), keeping their order; a
    forward holds rows of one runner. A row with no new ids joins none."""
    forwards: list[list[Row]] = []
    current: list[Row] = []
    tokens = 0
    for row in rows:
        if not row.new_ids:
            continue
        if current and (tokens + row.num_tokens > max_tokens or row.runner is not current[0].runner):
            forwards.append(current)
            current, tokens = [], 0
        current.append(row)
        tokens += row.num_tokens
    if current:
        forwards.append(current)
    return forwards


def run_forward(rows: list[Row]) -> list[RowResult]:
    """One forward over `rows` (all of one runner): `ModelRunner.extend_rows`."""
    runner = rows[0].runner
    try:
        if runner is None:
            raise ValueError("a row planned by the worker names the runner that runs it")
        done = runner.extend_rows(rows)
    except BaseException as exc:  # every row of the forward shares its failure
        return [RowResult(False, exc) for _ in rows]
    return [RowResult(bool(ok)) for ok in done]


def run_rows(rows: list[Row], max_tokens: int) -> tuple[list[RowResult], list[int]]:
    """Run every row (`pack_forwards`, `run_forward`). Returns each row's
    result, in order, and the number of rows in each forward that ran."""
    results: dict[int, RowResult] = {id(row): RowResult(True) for row in rows if not row.new_ids}
    sizes = []
    for forward in pack_forwards(rows, max_tokens):
        sizes.append(len(forward))
        for row, result in zip(forward, run_forward(forward)):
            results[id(row)] = result
    return [results[id(row)] for row in rows], sizes
