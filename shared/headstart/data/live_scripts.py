"""The Lua scripts of `headstart.data.live_store`: each check-then-write in one step.

A script runs atomically in Redis, so concurrent writers (two flash workers, a
replica rebuilt beside its predecessor) cannot interleave between the check
(a version moving forward, the flash bound, an answer newer than the stored
one) and the write.
"""

# KEYS: version, versions stream, events stream
# ARGV: version, sid, tenant, rows_added, dropped_total, versions maxlen, events maxlen, event payload,
#       lag_versions
PUBLISH_VERSION = """
local v = tonumber(ARGV[1])
if v <= tonumber(redis.call('GET', KEYS[1]) or '0') then return false end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'sid', ARGV[2], 'tenant', ARGV[3],
           'version', ARGV[1], 'rows_added', ARGV[4], 'dropped_total', ARGV[5], 'lag_versions', ARGV[9] or '0')
return redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'kind', 'data_updated', 'payload', ARGV[8])
"""

# KEYS: flash, flash_norm, flash_seq   ARGV: question, max_flash  ->  {status, qid}
REGISTER_FLASH = """
local existing = redis.call('HGET', KEYS[2], ARGV[1])
if existing then return {0, existing} end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[2]) then return {-1, ''} end
local qid = 'q' .. redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], qid, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], qid)
return {1, qid}
"""

# KEYS: flash, flash_norm, answers, answer_ver   ARGV: qid  ->  1 when it was registered
DELETE_FLASH = """
local question = redis.call('HGET', KEYS[1], ARGV[1])
if not question then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HGET', KEYS[2], question) == ARGV[1] then redis.call('HDEL', KEYS[2], question) end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
"""

# KEYS: flash, answers, answer_ver, events   ARGV: qid, version, answer JSON, publish (0/1), events maxlen
#   ->  0 when not stored, else 1 or the flash_ready event's id
STORE_ANSWER = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if tonumber(ARGV[2]) <= tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '-1') then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if ARGV[4] == '1' then
  return redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'flash_ready', 'payload', ARGV[3])
end
return 1
"""
