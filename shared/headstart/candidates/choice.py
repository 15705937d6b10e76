"""Choose among candidates by what their SQL returned.

The rule (self-consistency over execution results, `headstart.eval.candidate_vote`,
the evaluator's too): candidates whose SQL ran are grouped by their
canonical result key; the largest group wins; a tie goes to the group
holding the greedy answer, else to the group whose lowest index is lowest.
SQL that failed never wins while another ran; when every candidate failed,
the greedy answer stands with its error.
"""

from __future__ import annotations

from collections.abc import Sequence

from headstart.candidates.records import GREEDY_INDEX, CheckedChoice, RunOutcome
from headstart.eval.candidate_vote import winning_key


def choose(outcomes: Sequence[RunOutcome]) -> CheckedChoice:
    """The checked answer of `outcomes` (one per candidate; the greedy one has index 0).

    Raises:
        ValueError: no outcomes, or none for the greedy answer.
    """
    ordered = sorted(outcomes, key=lambda o: o.index)
    if not ordered or ordered[0].index != GREEDY_INDEX:
        raise ValueError("a candidate set's outcomes include the greedy answer's (index 0)")
    failed = tuple(o.index for o in ordered if not o.ok)
    key = winning_key([o.key for o in ordered])
    if key is None:
        greedy = ordered[0]
        return CheckedChoice(greedy.index, greedy.sql, (), (), 0, len(ordered), failed,
                             greedy.error or greedy.error_code or "failed", tuple(ordered))
    group = [o for o in ordered if o.key == key]
    chosen = group[0]  # the greedy answer when its group won (index 0 sorts first)
    return CheckedChoice(chosen.index, chosen.sql, chosen.columns, chosen.rows, len(group), len(ordered), failed,
                         None, tuple(ordered))
