-- begin_job: record a job in state `creating` (invisible until finish_job).
-- KEYS: the job's keys (_job.lua); writes META.
-- ARGV[1] created_at_ms   ARGV[2] spec (JSON)   ARGV[3] max_tokens ('' = none)
-- ARGV[4] concurrency
-- Returns 1, or an error if the job id is taken.
if redis.call('EXISTS', META) == 1 then
  return redis.error_reply('ERR job exists')
end
redis.call('HSET', META, 'created_at_ms', ARGV[1], 'spec', ARGV[2], 'state', S_CREATING,
  'max_tokens', ARGV[3], 'concurrency', ARGV[4], 'total', 0, 'pending', 0, 'running', 0,
  'completed', 0, 'failed', 0, 'tokens_in', 0, 'tokens_out', 0, 'tokens_charged', 0,
  'tokens_reserved', 0, 'estimated_tokens', 0, 'skipped', 0, 'skipped_events', 0,
  'max_index', -1, 'run_epoch', 0)
return 1
