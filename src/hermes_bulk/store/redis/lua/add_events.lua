-- add_events: append events to a job's history (the newest EVENTS_KEPT are kept).
-- KEYS: the job's keys (_job.lua); writes META, EVENTS.
-- ARGV[1] how many of these events are `skipped` (counted for finish_job)
-- ARGV[2..]: pairs of at_ms ('0' = now) and body (JSON [kind, message, index, error_type,
--            http_status]).
-- Returns the number added (0 for an unknown job: nothing is left behind for it).
if redis.call('EXISTS', META) == 0 then
  return 0
end
local now = now_ms()
for i = 2, #ARGV, 2 do
  local at = tonumber(ARGV[i])
  if at <= 0 then at = now end
  redis.call('RPUSH', EVENTS, fmt_ms(at) .. '\t' .. ARGV[i + 1])
end
redis.call('LTRIM', EVENTS, -EVENTS_KEPT, -1)
if tonumber(ARGV[1]) > 0 then
  redis.call('HINCRBY', META, 'skipped_events', ARGV[1])
end
return (#ARGV - 1) / 2
