-- set_sample: limit the job's claims to these items (run --sample), or clear that.
-- KEYS: the job's keys (_job.lua); writes META.
-- ARGV[1] the indexes as a JSON array, lowest first ('' = clear)
-- Returns 1, or 0 when there is no such job (or it is still being created).
if redis.call('EXISTS', META) == 0 or redis.call('HGET', META, 'state') == S_CREATING then
  return 0
end
if ARGV[1] == '' then
  redis.call('HDEL', META, 'sample')
else
  redis.call('HSET', META, 'sample', ARGV[1])
end
return 1
