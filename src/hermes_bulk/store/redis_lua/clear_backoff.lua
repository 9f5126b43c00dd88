-- clear_backoff: a request succeeded. The next wait without Retry-After starts from the base
-- again, and the adaptive rate rises by the AIMD increase factor (off again once fast).
-- KEYS[1] {<prefix>:limit:<key>} (HASH, as acquire.lua)
-- ARGV[1] AIMD increase factor   ARGV[2] shortest adaptive interval, ms (below it: off)
-- Returns 1 if anything changed, 0 if there was nothing to change.
local h = redis.call('HMGET', KEYS[1], 'backoff_step', 'auto_interval_ms')
local step, auto_interval = tonumber(h[1]) or 0, tonumber(h[2]) or 0
if step == 0 and auto_interval == 0 then return 0 end
auto_interval = auto_interval / tonumber(ARGV[1])
if auto_interval < tonumber(ARGV[2]) then auto_interval = 0 end
redis.call('HSET', KEYS[1], 'backoff_step', 0, 'auto_interval_ms', fmt_ms(auto_interval))
return 1
