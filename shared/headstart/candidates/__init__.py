"""Execution-checked answers: run each candidate SQL read-only and choose by what it returns.

`records` holds the typed objects (`Candidate`, `RunOutcome`, `CheckedChoice`),
`result_key` the canonical key two equal results share, `runner` runs the
SQL with the execute edge's limits off the caller's thread, and `choice`
picks the answer: the largest group of SQL that ran, ties to the greedy
answer's group. `checked_answers.CheckedAnswers` puts them together for a
request of the engine: its candidates awaited, run, chosen, as a future.
"""

from headstart.candidates.checked_answers import CheckedAnswers
from headstart.candidates.choice import choose
from headstart.candidates.records import Candidate, CheckedChoice, RunOutcome
from headstart.eval.result_key import result_key
from headstart.candidates.runner import CandidateLimits, CandidateRunner

__all__ = ["Candidate", "CandidateLimits", "CheckedAnswers", "CandidateRunner", "CheckedChoice", "RunOutcome", "choose", "result_key"]
