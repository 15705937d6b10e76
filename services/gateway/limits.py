"""Edge limits: message size, text length, messages per second per connection,
work (characters to prefill) per second per tenant."""

from __future__ import annotations

import time

from headstart.client.errors import ApiError

MAX_TABLES = 512
MAX_TABLE_NAME_CHARS = 256


class RateLimiter:
    """A token bucket: `rate` messages per second sustained, `burst` at once."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self._tokens = float(burst)
        self._last = clock()

    def can_take(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        return self._tokens >= 1.0

    def take(self) -> None:
        """Spend one message or raise ApiError(RATE_LIMITED)."""
        if not self.can_take():
            raise ApiError("RATE_LIMITED", f"more than {self.rate:g} messages/s on this connection")
        self._tokens -= 1.0

    def take_cost(self, cost: float) -> bool:
        """Spend `cost` tokens if the bucket holds them (a cost above `burst` needs a full bucket)."""
        self.can_take()
        if self._tokens < min(cost, self.burst):
            return False
        self._tokens -= cost
        return True


class TenantWorkBudget:
    """Per tenant, a bucket of characters the engine must prefill: `rate` per
    second sustained, `burst` at once. Shared by all of a tenant's
    connections, so ten connections each at their message limit still spend
    one budget; a message costs the text it adds, not one unit."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: dict[str, RateLimiter] = {}

    def spend(self, tenant: str, chars: int) -> None:
        """Raise ApiError(RATE_LIMITED) when `tenant` has not got `chars` left."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = RateLimiter(self.rate, self.burst, self.clock)
        if not bucket.take_cost(max(1, chars)):
            raise ApiError("RATE_LIMITED", f"this tenant's work is over {self.rate:g} characters/s")


def new_chars(previous: str, text: str) -> int:
    """Characters of `text` past its common prefix with `previous` (what a snapshot makes the engine prefill)."""
    n = min(len(previous), len(text))
    i = 0
    while i < n and previous[i] == text[i]:
        i += 1
    return len(text) - i


def check_size(num_bytes: int, limit: int) -> None:
    if num_bytes > limit:
        raise ApiError("MESSAGE_TOO_LARGE", f"message of {num_bytes} bytes; the limit is {limit}")


def check_text(text: object, limit: int) -> str:
    if not isinstance(text, str):
        raise ApiError("INVALID_ARGUMENT", "text must be a string")
    if len(text) > limit:
        raise ApiError("TEXT_TOO_LONG", f"text has {len(text)} characters; the limit is {limit}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a JSON "\ud800" escape: not sendable as protobuf string
        raise ApiError("INVALID_ARGUMENT", f"text is not valid Unicode (lone surrogate at {exc.start})") from exc
    return text


MAX_SEQ = 2**62  # seqs stay below it (int64 on every wire, with room)
# NOTE: the most one message may move a session's seq forward. Without it a single
# message with seq 2^62-1 wedged its session: no later snapshot could be newer
# (issue 29). With it, reaching the ceiling takes 2^30 messages (200 days at the
# per-connection rate limit). Counters (what every client sends) never come near it.
MAX_SEQ_STEP = 2**32


def check_seq(seq: object, current: int = 0) -> int:
    """A message's seq: a positive int below MAX_SEQ, at most MAX_SEQ_STEP past the session's
    `current` one (older ones pass: the caller ignores them or calls them stale)."""
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 < seq < MAX_SEQ:
        raise ApiError("INVALID_ARGUMENT", "seq must be a positive integer")
    if seq - current > MAX_SEQ_STEP:
        raise ApiError("INVALID_ARGUMENT", f"seq {seq} jumps more than 2^32 past this session's {current}: "
                                           "seq counts messages, it is not a clock")
    return seq


def check_tables(tables: object) -> list[str] | None:
    """A Complete's table selection: None or [] (the whole schema) or table names.

    Only the shape is checked here; whether the database has those tables,
    once each, is the engine's answer (INVALID_ARGUMENT naming the table).
    """
    if tables is None:
        return None
    if not isinstance(tables, (list, tuple)):
        raise ApiError("INVALID_ARGUMENT", "tables must be a list of table names")
    if len(tables) > MAX_TABLES:
        raise ApiError("INVALID_ARGUMENT", f"tables lists {len(tables)} names; the limit is {MAX_TABLES}")
    for name in tables:
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_TABLE_NAME_CHARS:
            raise ApiError("INVALID_ARGUMENT", f"tables must be non-empty names of at most "
                                               f"{MAX_TABLE_NAME_CHARS} characters, got {name!r:.80}")
    return list(tables) or None
