"""What the data users (`users.DataProducer`, `users.FlashSubscriber`) need that
does not import Locust, so it is tested without gevent: the rows they push,
the clock from a push's ack to the event of its data version, and an SSE parser.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

# The first "{n}" of a user's rows: above the ids of the Spider databases' own
# rows, so pushed rows never collide with a primary key the database holds.
FIRST_ROW_NUMBER = 1_000_000


class RowTemplate:
    """Rows from a JSON template of one row (or a list of rows), as the page's panel makes them.

    In any string value, "{n}" is the row's number (a whole "{n}" becomes the
    int) and "{r}" a random number (a whole "{r}" becomes a float in 0..100).
    All "{n}" of one row share one number; each row takes the next.
    """

    def __init__(self, template: str, seed: int | str = 0, first: int = FIRST_ROW_NUMBER):
        try:
            parsed = json.loads(template)
        except ValueError as exc:
            raise ValueError(f"the row template is not JSON: {exc}") from None
        self.rows_of_one = parsed if isinstance(parsed, list) else [parsed]
        if not self.rows_of_one or not all(isinstance(r, dict) and "table" in r for r in self.rows_of_one):
            raise ValueError("the row template must be a row {table, values} or a non-empty list of them")
        self.next_number = first
        self.rng = random.Random(seed)

    def rows(self, count: int) -> list[dict]:
        """`count` rows (the template's rows in turn), each with the next number."""
        out = []
        for i in range(count):
            out.append(self._expand(self.rows_of_one[i % len(self.rows_of_one)], self.next_number))
            self.next_number += 1
        return out

    def _expand(self, value, n: int):
        if value == "{n}":
            return n
        if value == "{r}":
            return round(self.rng.uniform(0, 100), 2)
        if isinstance(value, str):
            return value.replace("{n}", str(n)).replace("{r}", str(round(self.rng.uniform(0, 100), 2)))
        if isinstance(value, list):
            return [self._expand(v, n) for v in value]
        if isinstance(value, dict):
            return {k: self._expand(v, n) for k, v in value.items()}
        return value


class PushClock:
    """Acknowledged pushes waiting for the event of their data version.

    A push's rows are in data version `newest_seq` or any later one (the data
    version is the seq of the newest ingested row), so an event of version v
    completes every waiting push whose newest seq is <= v: several pushes
    ingested in one batch, or a version the flash worker skipped, are each
    counted once, from their own ack.
    """

    def __init__(self):
        self._waiting: list[tuple[int, float]] = []  # (newest seq, ack time), seqs increasing

    def acked(self, newest_seq: int, at: float) -> None:
        self._waiting.append((newest_seq, at))

    def reached(self, version: int) -> list[float]:
        """Ack times of the pushes version `version` completes (and forgets)."""
        done = [t for seq, t in self._waiting if seq <= version]
        self._waiting = [(seq, t) for seq, t in self._waiting if seq > version]
        return done

    def expired(self, before: float) -> list[float]:
        """Ack times of waiting pushes acked before `before` (forgotten: they timed out)."""
        late = [t for _, t in self._waiting if t < before]
        self._waiting = [(seq, t) for seq, t in self._waiting if t >= before]
        return late

    def __len__(self) -> int:
        return len(self._waiting)


@dataclass(frozen=True)
class SseEvent:
    id: str | None
    kind: str
    payload: dict


class SseParser:
    """Server-sent events, a line at a time (`feed` returns the event a blank line ends).

    Follows the gateway's frames (`id:`, `event:`, `data:` JSON; `:` comments
    as keep-alives); `last_id` is what a reconnect sends as Last-Event-ID.
    """

    def __init__(self):
        self.last_id: str | None = None
        self._id = self._kind = None
        self._data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        line = line.rstrip("\r")
        if line:
            if not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "id":
                    self._id = value
                elif name == "event":
                    self._kind = value
                elif name == "data":
                    self._data.append(value)
            return None
        if self._id is not None:
            self.last_id = self._id
        event = None
        if self._data:
            event = SseEvent(self._id, self._kind or "message", json.loads("\n".join(self._data)))
        self._id = self._kind = None
        self._data = []
        return event
