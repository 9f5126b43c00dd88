-- mark_interrupted: record why a running job's workers stopped, or clear it.
-- KEYS: the job's keys (_job.lua); writes META, EVENTS.
-- ARGV[1] reason ('' = clear)   ARGV[2] event body ('' = no event; JSON as add_events)
-- Returns 1, or false when the job is not running (nothing changed).
if redis.call('HGET', META, 'state') ~= S_RUNNING then return false end
local now = now_ms()
if ARGV[1] == '' then
  redis.call('HDEL', META, 'interrupted', 'interrupted_at_ms')
else
  redis.call('HSET', META, 'interrupted', ARGV[1], 'interrupted_at_ms', fmt_ms(now))
end
if ARGV[2] ~= '' then
  redis.call('RPUSH', EVENTS, fmt_ms(now) .. '\t' .. ARGV[2])
  redis.call('LTRIM', EVENTS, -EVENTS_KEPT, -1)
end
return 1
