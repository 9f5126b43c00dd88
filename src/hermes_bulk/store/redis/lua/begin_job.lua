-- begin_job: record a job in state `creating` (invisible until finish_job).
-- KEYS: the job's keys (_job.lua); writes META.
-- ARGV[1] created_at_ms   ARGV[2] spec (JSON)   ARGV[3] max_tokens ('' = none)
-- ARGV[4] concurrency   ARGV[5] output_tokens_estimate   ARGV[6] max_output_tokens ('' = none)
-- ARGV[7] drop_content (1: a completed item's content is dropped, protocol.drops_content)
-- ARGV[8] max_cost in nano-USD ('' = none)   ARGV[9] the rates its claims reserve at
-- (records.cost_rates, space-separated; '' = none)
-- The spec's output allowance is kept as plain fields too, so a claim never decodes the spec.
-- Returns 1, or an error if the job id is taken.
if redis.call('EXISTS', META) == 1 then
  return redis.error_reply('ERR job exists')
end
redis.call('HSET', META, 'created_at_ms', ARGV[1], 'spec', ARGV[2], 'state', S_CREATING,
  'max_tokens', ARGV[3], 'concurrency', ARGV[4], 'total', 0, 'pending', 0, 'running', 0,
  'completed', 0, 'failed', 0, 'tokens_in', 0, 'tokens_out', 0, 'tokens_charged', 0,
  'tokens_reserved', 0, 'estimated_tokens', 0, 'skipped', 0, 'skipped_events', 0,
  'max_index', -1, 'run_epoch', 0, 'output_tokens_estimate', ARGV[5], 'max_output_tokens', ARGV[6],
  'drop_content', ARGV[7], 'max_cost', ARGV[8], 'cost_rates', ARGV[9], 'cost_reserved', 0)
return 1
