-- finish_job: move a `creating` job to `not_started` with its totals.
-- KEYS: the job's keys (_job.lua); reads and writes META.
-- ARGV: none.
-- Returns 1 when the job moved, 0 when it was not being created.
if redis.call('HGET', META, 'state') ~= S_CREATING then
  return 0
end
local total = tonumber(redis.call('HGET', META, 'added') or '0')
local reused = tonumber(redis.call('HGET', META, 'reused') or '0')
redis.call('HSET', META, 'state', S_NOT_STARTED, 'total', total, 'pending', total - reused, 'completed', reused,
  'skipped', redis.call('HGET', META, 'skipped_events'))
return 1
