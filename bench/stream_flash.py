"""bench stream's flash side: what the flash worker computes for a registered
question on a data version (stored with `LiveStore.store_answer`, then looked
up by the benchmark's flash mode)."""

from __future__ import annotations

import time


def evaluate_one(session, question: str, new_tokens: int) -> dict:
    """The answer a flash worker stores for `question` on the session's current
    version: `DataSession.evaluate` (FLASH priority, in place on the live cache,
    its SQL run on the working copy at that version)."""
    a = session.evaluate([question], max_new_tokens=new_tokens)[0]
    return dict(question=a.question, version=a.version, text=a.text, sql=a.sql, columns=list(a.columns),
                rows=[list(r) for r in a.rows], error=a.error, logit_gap=a.logit_gap, computed_at=time.time())
