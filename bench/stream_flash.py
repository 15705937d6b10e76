"""bench stream's flash side: what the flash worker computes for a registered
question on a data version (stored with `LiveStore.store_answer`, then looked
up by the benchmark's flash mode)."""

from __future__ import annotations

import time

import torch

from headstart.engine.errors import InvalidInput


def evaluate_one(session, question: str, new_tokens: int) -> tuple[dict, str]:
    """The answer dict a flash worker stores for `question` on the session's current
    version, and which session method made it (`DataSession.evaluate` where the
    session has it, else `DataSession.query` plus the SQL run at its version)."""
    if hasattr(session, "evaluate"):
        a = session.evaluate([question], max_new_tokens=new_tokens)[0]
        return dict(question=a.question, version=a.version, text=a.text, sql=a.sql, columns=list(a.columns),
                    rows=[list(r) for r in a.rows], error=a.error, logit_gap=a.logit_gap,
                    computed_at=time.time()), "DataSession.evaluate"
    result = session.query(question, new_tokens)
    columns, rows, error = [], [], ""
    try:
        columns, rows = session.execute(result.sql, result.data_version)
    except InvalidInput as exc:  # SqlError included: a random model's SQL rarely runs
        error = exc.message
    top = torch.topk(result.first_logits.double(), 2).values
    return dict(question=question, version=result.data_version, text=result.text, sql=result.sql,
                columns=list(columns), rows=[list(r) for r in rows], error=error, logit_gap=float(top[0] - top[1]),
                computed_at=time.time()), "DataSession.query"
