-- set_state: move a job to a state if it is in one of the allowed states.
-- KEYS: the job's keys (_job.lua); writes META, EVENTS.
-- ARGV[1] state   ARGV[2] pause_reason ('' = none)   ARGV[3] max_tokens ('' = unchanged)
-- ARGV[4] event at_ms ('0' = now)   ARGV[5] event body ('' = no event; JSON as add_events)
-- ARGV[6] max_cost in nano-USD ('' = unchanged)   ARGV[7] the rates its claims reserve at (as
-- begin_job's ARGV[9]; written with max_cost)
-- ARGV[8..] the states it may move from
-- Returns the job's run epoch when it moved (bumped on every move to running, so the
-- active-jobs index can be pruned without a race), or false when nothing changed.
local state = redis.call('HGET', META, 'state')
if not state then return false end
local allowed = false
for i = 8, #ARGV do
  if ARGV[i] == state then allowed = true end
end
if not allowed then return false end
local now = now_ms()
redis.call('HSET', META, 'state', ARGV[1])
if ARGV[2] == '' then
  redis.call('HDEL', META, 'pause_reason')
else
  redis.call('HSET', META, 'pause_reason', ARGV[2])
end
if ARGV[3] ~= '' then
  redis.call('HSET', META, 'max_tokens', ARGV[3])
end
if ARGV[6] ~= '' then
  redis.call('HSET', META, 'max_cost', ARGV[6], 'cost_rates', ARGV[7])
end
if ARGV[1] == S_RUNNING then
  redis.call('HSET', META, 'run_at_ms', fmt_ms(now))
  redis.call('HINCRBY', META, 'run_epoch', 1)
  redis.call('HDEL', META, 'interrupted', 'interrupted_at_ms')
end
if ARGV[5] ~= '' then
  local at = tonumber(ARGV[4])
  if at <= 0 then at = now end
  redis.call('RPUSH', EVENTS, fmt_ms(at) .. '\t' .. ARGV[5])
  redis.call('LTRIM', EVENTS, -EVENTS_KEPT, -1)
end
return tonumber(redis.call('HGET', META, 'run_epoch'))
