-- clear_backoff: a request succeeded, so the next wait without Retry-After starts from the
-- base again.
-- KEYS[1] {<prefix>:limit:<key>} (HASH, as acquire.lua)
-- ARGV: none.
-- Returns 1 if the step was reset, 0 if there was nothing to reset.
local step = redis.call('HGET', KEYS[1], 'backoff_step')
if not step or step == '0' then return 0 end
redis.call('HSET', KEYS[1], 'backoff_step', 0)
return 1
