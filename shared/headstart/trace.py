"""Typing traces: what a user typed, when. JSON lines on disk.

Each line is `{"t": seconds, "text": "full text after this event"}`; the last
line is `{"t": seconds, "submit": true}` (the submitted text is the last text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be replayed (bad JSON, times going back, no submit)."""


@dataclass(frozen=True)
class TraceEvent:
    t: float
    text: str


@dataclass(frozen=True)
class Trace:
    events: tuple[TraceEvent, ...]
    submit_t: float

    @property
    def final_text(self) -> str:
        return self.events[-1].text if self.events else ""

    def to_jsonl(self) -> str:
        lines = [json.dumps({"t": round(e.t, 6), "text": e.text}, ensure_ascii=False) for e in self.events]
        lines.append(json.dumps({"t": round(self.submit_t, 6), "submit": True}))
        return "\n".join(lines) + "\n"


def parse_trace(text: str, source: str = "<trace>") -> Trace:
    events: list[TraceEvent] = []
    submit_t = None
    last_t = 0.0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{source}:{lineno}: not JSON: {exc.msg}") from exc
        if submit_t is not None:
            raise TraceError(f"{source}:{lineno}: event after the submit line")
        t = obj.get("t")
        if not isinstance(t, (int, float)) or t < last_t:
            raise TraceError(f"{source}:{lineno}: 't' must be a number not smaller than the previous one")
        last_t = float(t)
        if obj.get("submit") is True:
            submit_t = float(t)
        elif isinstance(obj.get("text"), str):
            events.append(TraceEvent(float(t), obj["text"]))
        else:
            raise TraceError(f"{source}:{lineno}: expected a 'text' string or 'submit': true")
    if submit_t is None:
        raise TraceError(f"{source}: no submit line at the end")
    return Trace(tuple(events), submit_t)


def load_trace(path: Path | str) -> Trace:
    path = Path(path)
    try:
        return parse_trace(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from exc
