"""A data session's rows log in Redis: a push numbered and logged in one atomic step.

Keys (`P:data:S:` as in `live_store`):

    seq       string  last row sequence number handed out
    rows      zset    JSON [seq, row] scored by seq: the rebuild source, newest `max_rows`
    pushes    hash    push id -> JSON {first, count, digest, ack}: what a retry is answered with
    push_ids  zset    push id scored by when it was logged (ms): the oldest leave first

`log_push` runs one Lua script: it answers a push id seen before with the
earlier push, or advances `seq` by the push's rows, adds the rows under those
seqs and records the push id, all or nothing. So the counter never runs ahead
of the rows (nor behind them) whatever fails between two round trips, and a
retried push adds nothing. With `floor` it first lifts `seq` to at least
`floor`: a replica that has seen seqs the store lost (a Redis restarted
without the tail of its file) gets the push renumbered above them
(services/gateway/data_service.py).

A push id is kept `push_id_ttl_s` and at most `max_push_ids` per session
(the oldest leave first): a retry later than that is a new push.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import NamedTuple

from headstart.data.live_errors import as_str, guarded
from headstart.engine.errors import InvalidInput

PUSH_ID_TTL_S = 24 * 3600
MAX_PUSH_IDS = 10_000
MAX_PUSH_ID_CHARS = 128

# KEYS: seq, rows, pushes, push_ids
# ARGV: push_id ('' none), digest, floor, drop_first, drop_last (0 0: none), now_ms, ttl_ms, max_ids,
#       max_rows, then one canonical row JSON per row   ->  {0, record} replayed | {1, first seq}
LOG_PUSH = """
local n = #ARGV - 9
local id = ARGV[1]
if id ~= '' and ARGV[5] == '0' then
  local record = redis.call('HGET', KEYS[3], id)
  if record then return {0, record} end
end
if ARGV[5] ~= '0' then redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[4], ARGV[5]) end
if tonumber(ARGV[3]) > tonumber(redis.call('GET', KEYS[1]) or '0') then redis.call('SET', KEYS[1], ARGV[3]) end
local first = redis.call('INCRBY', KEYS[1], n) - n + 1
local members = {}
for i = 1, n do
  local seq = first + i - 1
  members[#members + 1] = seq
  members[#members + 1] = '[' .. string.format('%d', seq) .. ',' .. ARGV[9 + i] .. ']'
  if #members >= 1000 or i == n then  -- in chunks: Lua's unpack has a stack limit
    redis.call('ZADD', KEYS[2], unpack(members))
    members = {}
  end
end
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(tonumber(ARGV[9]) + 1))
if id ~= '' then
  redis.call('HSET', KEYS[3], id, cjson.encode({first = first, count = n, digest = ARGV[2]}))
  redis.call('ZADD', KEYS[4], ARGV[6], id)
  local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', tonumber(ARGV[6]) - tonumber(ARGV[7]))
  local extra = redis.call('ZCARD', KEYS[4]) - #old - tonumber(ARGV[8])
  if extra > 0 then
    for _, more in ipairs(redis.call('ZRANGE', KEYS[4], #old, #old + extra - 1)) do old[#old + 1] = more end
  end
  for _, gone in ipairs(old) do
    redis.call('HDEL', KEYS[3], gone)
    redis.call('ZREM', KEYS[4], gone)
  end
end
return {1, first}
"""

# KEYS: pushes   ARGV: push id, ack JSON  ->  1 when the push id was still recorded
RECORD_ACK = """
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then return 0 end
local fields = cjson.decode(record)
fields.ack = ARGV[2]
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(fields))
return 1
"""

# KEYS: rows, pushes, push_ids   ARGV: first, last, push id ('' none)
UNLOG_PUSH = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then
  redis.call('HDEL', KEYS[2], ARGV[3])
  redis.call('ZREM', KEYS[3], ARGV[3])
end
return 1
"""


class LoggedPush(NamedTuple):
    """What `log_push` did: the rows' seqs, and the earlier ack when the push id was seen before
    (`replayed`; then nothing was added; None when the earlier push's ack was never recorded)."""

    seqs: list[int]
    replayed: bool = False
    ack: dict | None = None


def row_json(row: dict) -> str:
    """A row's canonical JSON: what the log keeps (with its seq: `[seq,row]`)."""
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


def check_push_id(push_id: object) -> str | None:
    """A client's push id (None or "": none), or InvalidInput."""
    if push_id is None or push_id == "":
        return None
    if not isinstance(push_id, str) or len(push_id) > MAX_PUSH_ID_CHARS or not push_id.isprintable():
        raise InvalidInput(f"push_id must be a string of 1..{MAX_PUSH_ID_CHARS} printable characters")
    return push_id


class RowsLog:
    """The rows-log half of `LiveStore` (it provides `client`, `key`, `max_rows`)."""

    push_id_ttl_s: float = PUSH_ID_TTL_S
    max_push_ids: int = MAX_PUSH_IDS

    def _rows_scripts(self) -> None:
        self._log_push = self.client.register_script(LOG_PUSH)
        self._record_ack = self.client.register_script(RECORD_ACK)
        self._unlog_push = self.client.register_script(UNLOG_PUSH)

    def _push_keys(self, sid: str) -> list[str]:
        return [self.key(sid, "seq"), self.key(sid, "rows"), self.key(sid, "pushes"), self.key(sid, "push_ids")]

    @guarded
    def log_push(self, sid: str, rows: list[dict], push_id: str | None = None, *, floor: int = 0,
                 replacing: tuple[int, int] | None = None) -> LoggedPush:
        """Number `rows` after the session's last seq and log them, in one step (module docstring).

        Args:
            push_id: the client's id of this push: a push id logged before is answered with that
                push (`replayed`), nothing added; the same id with other rows is InvalidInput.
            floor: number the rows above at least this seq (the counter is lifted first).
            replacing: (first, last) seqs of this push logged before, taken out in the same step
                (a renumbering); the push id's record then names the new seqs.

        Raises:
            InvalidInput: the push id was used by a push of other rows.
        """
        if not rows:
            raise ValueError("a push has at least one row")
        lines = [row_json(row) for row in rows]
        digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
        drop_first, drop_last = replacing or (0, 0)
        status, value = self._log_push(keys=self._push_keys(sid), args=[
            push_id or "", digest, int(floor), int(drop_first), int(drop_last), int(time.time() * 1000),
            int(self.push_id_ttl_s * 1000), self.max_push_ids, self.max_rows, *lines])
        if int(status) == 1:
            first = int(value)
            return LoggedPush(list(range(first, first + len(rows))))
        record = json.loads(as_str(value))
        if record["digest"] != digest:
            raise InvalidInput(f"push_id {push_id!r} was used by a push of other rows (a push id names one push)")
        first, count = int(record["first"]), int(record["count"])
        ack = json.loads(record["ack"]) if record.get("ack") else None
        return LoggedPush(list(range(first, first + count)), True, ack)

    @guarded
    def record_ack(self, sid: str, push_id: str, ack: dict) -> bool:
        """Keep the ack a push got under its push id (what a retry is answered with)."""
        return bool(self._record_ack(keys=[self.key(sid, "pushes")], args=[push_id, json.dumps(ack)]))

    @guarded
    def unlog_push(self, sid: str, seqs: list[int], push_id: str | None = None) -> None:
        """Take a push's rows (and its push id) out of the log again: it failed as a whole, so
        a rebuild never ingests rows the client was told failed, and a retry is a new push."""
        self._unlog_push(keys=[self.key(sid, "rows"), self.key(sid, "pushes"), self.key(sid, "push_ids")],
                         args=[int(seqs[0]), int(seqs[-1]), push_id or ""])

    @guarded
    def last_seq(self, sid: str) -> int:
        """The session's last sequence number handed out (0: none)."""
        raw = self.client.get(self.key(sid, "seq"))
        return 0 if raw is None else int(raw)

    @guarded
    def rows(self, sid: str) -> list[tuple[int, dict]]:
        """The kept rows, oldest first: `[(seq, {"table": ..., "values": {...}})]`."""
        out = []
        for member in self.client.zrange(self.key(sid, "rows"), 0, -1):
            seq, row = json.loads(member)
            out.append((int(seq), row))
        return out
