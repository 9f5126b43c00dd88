-- _job.lua: prepended to every per-job script.
--
-- KEYS are always the job's twelve keys and the store's answer index, in this order (RedisKeys.job builds them; all share
-- the hash tag {<prefix>:job:<id>}, so a job's script touches one cluster slot):
--   KEYS[1] meta      KEYS[2] items    KEYS[3] states   KEYS[4] contents  KEYS[5] results
--   KEYS[6] pending   KEYS[7] leases   KEYS[8] owners   KEYS[9] failed    KEYS[10] events
--   KEYS[11] keys     KEYS[12] dups    KEYS[13] answers (P:answers, shared by every job)
local META, ITEMS, STATES, CONTENTS, RESULTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local PENDING, LEASES, OWNERS, FAILED, EVENTS = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local AKEYS, DUPS, ANSWERS = KEYS[11], KEYS[12], KEYS[13]

-- Subtract n from a META counter. Not HINCRBY by -n: for n = 0 Lua's -n is -0, which reaches
-- Redis as "-0" and is refused ("value is not an integer"), failing the whole operation.
local function meta_decr(field, n)
  if n ~= 0 then redis.call('HINCRBY', META, field, -n) end
end

-- An item's changing fields; absent means a fresh pending item.
local function item_state(idx)
  local raw = redis.call('HGET', STATES, idx)
  if raw then return cjson.decode(raw) end
  return {s = S_PENDING, a = 0, w = 0, r = 0}
end

local function save_state(idx, st)
  redis.call('HSET', STATES, idx, cjson.encode(st))
end

-- Events are "<at_ms>\t<JSON [kind, message, index, error_type, http_status]>", newest kept.
local function add_event(at_ms, kind, message, idx, error_type, http_status)
  local null = cjson.null
  local body = cjson.encode({kind, message, idx or null, error_type or null, http_status or null})
  redis.call('RPUSH', EVENTS, fmt_ms(at_ms) .. '\t' .. body)
  redis.call('LTRIM', EVENTS, -EVENTS_KEPT, -1)
end

local function owned_by(idx, worker_id)
  return redis.call('HGET', OWNERS, idx) == worker_id
end

-- Take a running item off its lease; returns its state (reservation cleared) and the reservation.
local function unlease(idx)
  redis.call('ZREM', LEASES, idx)
  redis.call('HDEL', OWNERS, idx)
  local st = item_state(idx)
  local reserved = st.r or 0
  st.r = 0
  return st, reserved
end

-- A running item back to pending, nothing charged; returns the reservation it held.
local function requeue(idx)
  local st, reserved = unlease(idx)
  st.s = S_PENDING
  save_state(idx, st)
  redis.call('ZADD', PENDING, idx, idx)
  return reserved
end

local function count_released(n, reserved)
  meta_decr('running', n)
  redis.call('HINCRBY', META, 'pending', n)
  meta_decr('tokens_reserved', reserved)
end

-- Items taken back from workers (expired or dead) are recorded, like the SQLite store does.
local function released_event(now, n)
  add_event(now, 'recovered', string.format('%d interrupted item%s returned to the queue', n, n == 1 and '' or 's'))
end
