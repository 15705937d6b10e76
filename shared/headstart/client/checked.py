"""Execution-checked answers in the Python clients: what a caller asks (`candidates`), what it gets.

`candidates` is a count k (the greedy answer plus k-1 sampled ones), a dict
`{"k", "temperature", "seed", "wait_all"}` or a `CandidatesRequest`; None
leaves it to the server (HEADSTART_CANDIDATES). With k > 1 the server
streams the greedy answer as always, then a `Choice`: the SQL whose result
most candidates share, with its first rows (docs/api.md, "Checked answers").
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from headstart.v1 import types_pb2


def candidates_request(value: object) -> types_pb2.CandidatesRequest | None:
    """The wire form of a client's `candidates` (the server checks the values)."""
    if value is None or isinstance(value, types_pb2.CandidatesRequest):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return types_pb2.CandidatesRequest(k=value)
    if isinstance(value, dict):
        return types_pb2.CandidatesRequest(**value)
    raise TypeError("candidates: an int, a dict {k, temperature, seed, wait_all} or a CandidatesRequest")


def choice_rows(choice: types_pb2.Choice) -> list[list]:
    """The chosen SQL's first rows (each a list of cells)."""
    return json.loads(choice.rows_json or "[]")


@dataclass(frozen=True)
class CheckedAnswer:
    """A submit's or completion's answer: the greedy `result` and, when it decoded candidates,
    its execution-checked `choice` (None for one candidate)."""

    result: types_pb2.Result
    choice: types_pb2.Choice | None

    @property
    def sql(self) -> str:
        """The checked SQL (the greedy answer's when there is no choice)."""
        return self.choice.sql if self.choice is not None else self.result.sql

    @property
    def rows(self) -> list[list]:
        """The chosen SQL's first rows ([] without a choice)."""
        return choice_rows(self.choice) if self.choice is not None else []
