"""bench stream's flash side: evaluate a registered question on a version, store
its answer in Redis, look it up for (session, question, version).

The Redis layout is `headstart.data.live_store.LiveStore` (issue 12, part C)
when this checkout has it. Without it, `FlashStore` keeps the same contract in
a minimal layout of its own (a hash of registered questions, one JSON answer
per question, stored only when its version is newer, served only for the exact
version), so the benchmark measures the same two round trips either way; the
report names which one ran (`flash_store`).
"""

from __future__ import annotations

import json
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


def normalize(question: str) -> str:
    return " ".join(question.lower().split())


class FlashStore:
    """register / store_answer / lookup against a real Redis at `url`, under `prefix`."""

    def __init__(self, url: str, prefix: str):
        try:
            from headstart.data.live_store import LiveStore
        except ImportError:
            LiveStore = None
        self.prefix, self._sids = prefix, set()
        if LiveStore is not None:
            self.kind, self._live = "live_store", LiveStore(url, prefix=prefix)
            self._client = None
        else:
            import redis

            self.kind, self._live = "bench", None
            self._client = redis.Redis.from_url(url)

    def _key(self, sid: str, *parts: str) -> str:
        return ":".join((self.prefix, "data", sid, *parts))

    def register(self, sid: str, question: str) -> str:
        self._sids.add(sid)
        if self._live is not None:
            return self._live.register_flash(sid, question)
        qid = f"q{self._client.hlen(self._key(sid, 'flash')) + 1}"
        self._client.hset(self._key(sid, "flash"), qid, question)
        return qid

    def store_answer(self, sid: str, qid: str, answer: dict) -> bool:
        """Store `answer` unless a newer version is already stored (never goes back)."""
        if self._live is not None:
            return self._live.store_answer(sid, qid, answer)
        key = self._key(sid, "answer", qid)
        old = self._client.get(key)  # one writer (this benchmark): no race to guard
        if old is not None and json.loads(old)["version"] >= answer["version"]:
            return False
        self._client.set(key, json.dumps(answer, default=str))
        return True

    def lookup(self, sid: str, question: str, version: int) -> dict | None:
        """The stored answer of the registered `question` if it is for `version` exactly."""
        if self._live is not None:
            return self._live.lookup(sid, question, version)
        wanted = normalize(question)
        for qid, text in self._client.hgetall(self._key(sid, "flash")).items():
            if normalize(text.decode()) == wanted:
                raw = self._client.get(self._key(sid, "answer", qid.decode()))
                answer = json.loads(raw) if raw is not None else None
                return answer if answer is not None and answer["version"] == version else None
        return None

    def close(self) -> None:
        """Delete what this benchmark wrote, close the client."""
        if self._live is not None:
            for sid in self._sids:
                self._live.delete_session(sid)
            return
        for sid in self._sids:
            keys = list(self._client.scan_iter(match=self._key(sid, "*")))
            if keys:
                self._client.delete(*keys)
        self._client.close()
