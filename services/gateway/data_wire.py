"""Data API values between their wire forms: public proto, engine proto, JSON.

A row on every edge is `{"table": name, "values": {column: value}}`; the
public gRPC API spells a cell as a typed `DataValue` (so an INTEGER column's
value stays an int), the engine API as a JSON object. Answers come back as
one JSON shape on every edge (`answer_json`), whether the replica computed
them (`source: "model"`) or the store held them (`source: "flash"`).
"""

from __future__ import annotations

import json
import math

from headstart.data.rows import DataRow
from headstart.v1 import engine_pb2, headstart_pb2

SOURCES = ("flash", "model")


def row_dict(row: DataRow) -> dict:
    """The canonical form of a validated row: what the rows log keeps and the replica re-validates."""
    return {"table": row.table, "values": dict(zip(row.columns, row.values))}


def engine_rows(rows: list[tuple[int, dict]]) -> list[engine_pb2.DataRowWire]:
    """(seq, row dict) pairs as the engine API's rows."""
    return [engine_pb2.DataRowWire(seq=seq, table=row["table"], values_json=json.dumps(row["values"]))
            for seq, row in rows]


def cell_value(value: headstart_pb2.DataValue) -> int | float | str | None:
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return None
    return getattr(value, kind)


def proto_rows(rows) -> list[dict]:
    """Public gRPC `DataRow`s as row dicts (validated later, like JSON rows)."""
    return [{"table": r.table, "values": {name: cell_value(v) for name, v in r.values.items()}} for r in rows]


def ack_json(ack: engine_pb2.DataPushReply | None, seqs: list[int]) -> dict:
    """A push's ack: the rows' seqs, drops (this push's and the session's total), rows buffered."""
    if ack is None:
        return {"seqs": seqs, "dropped": 0, "dropped_seqs": [], "dropped_total": 0, "buffered": 0}
    return {"seqs": list(ack.seqs) or seqs, "dropped": ack.dropped, "dropped_seqs": list(ack.dropped_seqs),
            "dropped_total": ack.dropped_total, "buffered": ack.buffered}


def _finite(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def model_answer(answer: engine_pb2.DataAnswer) -> dict:
    """A replica's `DataAnswer` as the API's JSON answer."""
    try:
        rows = json.loads(answer.rows_json) if answer.rows_json else []
    except ValueError:
        rows = []
    return {"question": answer.question, "version": answer.version, "text": answer.text, "sql": answer.sql,
            "columns": list(answer.columns), "rows": rows, "error": answer.error or None,
            "logit_gap": _finite(answer.logit_gap), "ms": answer.ms, "speculative": answer.speculative,
            "source": "model"}


def flash_answer(stored: dict) -> dict:
    """A stored flash answer (see headstart.data.live_store) as the API's JSON answer."""
    return {"question": stored.get("question", ""), "version": int(stored.get("version", 0)),
            "text": stored.get("text", stored.get("sql", "")), "sql": stored.get("sql", ""),
            "columns": list(stored.get("columns") or []), "rows": list(stored.get("rows") or []),
            "error": stored.get("error") or None, "logit_gap": _finite(stored.get("logit_gap")),
            "ms": 0.0, "speculative": False, "source": "flash",
            "computed_at": stored.get("computed_at")}


def answer_proto(answer: dict) -> headstart_pb2.DataQueryAnswer:
    return headstart_pb2.DataQueryAnswer(
        question=answer["question"], version=answer["version"], text=answer["text"], sql=answer["sql"],
        columns=answer["columns"], rows_json=json.dumps(answer["rows"]), error=answer["error"] or "",
        logit_gap=answer["logit_gap"] or 0.0, ms=answer["ms"], speculative=answer["speculative"],
        source=answer["source"])


def describe_json(meta: dict, sid: str, info: engine_pb2.DataInfo) -> dict:
    """GET /v1/data/{sid}: the session (db, version) and what its replica says of it."""
    try:
        detail = json.loads(info.describe_json) if info.describe_json else {}
    except ValueError:
        detail = {}
    return {"session_id": sid, "db": meta["db"], "data_version": info.version, "replica": info.replica,
            "state": detail.get("state", "live"), "failure": detail.get("failure"),
            "rows_in_cache": info.rows_in_cache, "buffered": info.buffered, "dropped_total": info.dropped_total,
            "cache_tokens": info.cache_tokens, "sliding_tokens": info.sliding_tokens,
            "retention": info.retention,
            # acknowledged pushes not yet in the cache, their rows, the oldest one's age (headstart.data.lag)
            "lag": {"versions": int(detail.get("lag_versions", 0)), "rows": int(detail.get("lag_rows", 0)),
                    "seconds": float(detail.get("lag_seconds", 0.0))},
            "describe": detail}


def description_proto(d: dict) -> headstart_pb2.DataDescription:
    return headstart_pb2.DataDescription(
        session_id=d["session_id"], db=d["db"], data_version=d["data_version"], replica=d["replica"],
        rows_in_cache=d["rows_in_cache"], buffered=d["buffered"], dropped_total=d["dropped_total"],
        cache_tokens=d["cache_tokens"], sliding_tokens=d["sliding_tokens"], retention=d["retention"],
        describe_json=json.dumps(d["describe"]), state=d["state"], failure=d["failure"] or "")


def flash_proto(item: dict) -> headstart_pb2.FlashQuestion:
    answer = item.get("answer")
    return headstart_pb2.FlashQuestion(id=item["id"], question=item["question"],
                                       answer_json=json.dumps(answer) if answer is not None else "")
