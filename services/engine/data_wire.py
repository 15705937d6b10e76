"""Data sessions' wire messages (engine.proto) to and from the engine's values.

Kept apart from the RPC handlers so the handlers read as logic, and so the
gateway's tests can build the same messages the replica reads.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields

import torch

from headstart.data import DataSettings, PushAck
from headstart.data.answer import logit_gap
from headstart.engine.errors import InvalidInput
from headstart.v1 import engine_pb2

_SETTINGS_FIELDS = {f.name for f in fields(DataSettings)}


def settings_from_wire(wire: engine_pb2.DataSettingsWire | None) -> DataSettings:
    """DataSettings from the fields the caller set (the others keep their defaults).

    Raises:
        InvalidInput: a value DataSettings refuses.
    """
    values = {}
    if wire is not None:
        for descriptor, value in wire.ListFields():  # only the fields set (all are `optional`)
            if descriptor.name in _SETTINGS_FIELDS:
                values[descriptor.name] = value
    try:
        return DataSettings(**values)
    except TypeError as exc:  # a field this engine's DataSettings lacks
        raise InvalidInput(f"data settings: {exc}") from exc


def rows_from_wire(rows) -> tuple[list[dict], list[int] | None]:
    """Rows as `DataSession.push` takes them, and their seqs (None: all 0, the session numbers them).

    Raises:
        InvalidInput: a row's values are not a JSON object, or seqs are partly
            given (the message names the row).
    """
    out, seqs = [], []
    for index, row in enumerate(rows):
        try:
            values = json.loads(row.values_json) if row.values_json else None
        except ValueError as exc:
            raise InvalidInput(f"row {index}: values_json is not JSON ({exc})") from exc
        if not isinstance(values, dict):
            raise InvalidInput(f"row {index}: values_json must be a JSON object of column values")
        out.append({"table": row.table, "values": values})
        seqs.append(row.seq)
    given = [seq > 0 for seq in seqs]
    if any(given) and not all(given):
        first = given.index(False) if given[0] else given.index(True)
        raise InvalidInput(f"row {first}: either every row carries its seq or none does")
    return out, (seqs if seqs and all(given) else None)


def rebuild_rows(rows) -> list[tuple[int, dict]]:
    """DataOpen's rows as `DataSession(rows=...)` takes them: (seq, row) pairs, each with its seq.

    Raises:
        InvalidInput: a row without a seq (> 0) or with malformed values.
    """
    parsed, seqs = rows_from_wire(rows)
    if parsed and seqs is None:
        raise InvalidInput("row 0: rows to rebuild from must carry their seqs")
    return list(zip(seqs or [], parsed))


def push_reply(ack: PushAck, data_version: int) -> engine_pb2.DataPushReply:
    return engine_pb2.DataPushReply(
        seqs=list(ack.seqs), dropped=ack.dropped, dropped_seqs=list(ack.dropped_seqs),
        dropped_total=ack.dropped_total, buffered=ack.buffered, data_version=data_version)


def first_gap(logits: torch.Tensor | None) -> float:
    """The paper's confidence of an answer's first token (headstart.data.answer.logit_gap); 0 when unknown."""
    if logits is None or logits.numel() < 2:
        return 0.0
    return logit_gap(logits.reshape(-1))


def rows_json(rows) -> str:
    """A result's rows as a JSON list of lists (bytes as text; NaN/inf as null: JSON has neither)."""
    def cell(value):
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    return json.dumps([[cell(v) for v in row] for row in rows])


def answer(question: str, version: int, text: str, sql: str, columns=(), rows=(), error: str = "",
           gap: float = 0.0, seconds: float = 0.0, speculative: bool = False) -> engine_pb2.DataAnswer:
    return engine_pb2.DataAnswer(
        question=question, version=version, text=text, sql=sql, columns=list(columns), rows_json=rows_json(rows),
        error=error or "", logit_gap=gap, ms=seconds * 1000.0, speculative=speculative)


def flash_answer(flash) -> engine_pb2.DataAnswer:
    """A `FlashAnswer` (headstart.data, DataSession.evaluate) on the wire."""
    return answer(flash.question, flash.version, flash.text, flash.sql, flash.columns or (), flash.rows or (),
                  flash.error or "", float(flash.logit_gap or 0.0), float(flash.seconds or 0.0))


def info(replica: str, described: dict | None) -> engine_pb2.DataInfo:
    """DataInfo of a session's `describe()` (None: the replica does not hold it)."""
    if described is None:
        return engine_pb2.DataInfo(replica=replica, holds=False)
    return engine_pb2.DataInfo(
        replica=replica, holds=described.get("state") != "closed", version=described.get("data_version", 0),
        rows_in_cache=described.get("rows_in_cache", 0), buffered=described.get("buffered", 0),
        dropped_total=described.get("dropped", 0), cache_tokens=described.get("cache_tokens", 0),
        sliding_tokens=described.get("sliding_tokens", 0), retention=described.get("retention", ""),
        describe_json=json.dumps(described, default=str))
