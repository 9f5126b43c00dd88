-- settle_failed_attempt: record_attempt (a transient failure, not a 429), then fail_item when
-- the count is over the job's retries, else release_item, in one script: a worker killed
-- between them cannot leave the attempt counted with the item still held (counted twice later).
-- KEYS: the job's keys (_job.lua). scripts.py puts record_attempt.lua, fail_item.lua and
-- release_item.lua ahead of this as functions of their own ARGV.
-- ARGV[1] index   ARGV[2] worker_id   ARGV[3] error_type   ARGV[4] http_status ('' = none)
-- ARGV[5] message (our own text)   ARGV[6] retries
-- ARGV[7] tokens_in, ARGV[8] tokens_out the provider billed for the attempt ('' = none: nothing
-- charged), ARGV[9] its cost, ARGV[10] at the list price (nano-USD digits): charged as an answer
-- not kept, however the item settles
-- Returns the new attempt count, or -1 when worker_id does not hold the item (nothing changed).
need_buckets(with_duplicates(ARGV[1]))  -- fail_item's items, before record_attempt writes
local attempts = record_attempt({ARGV[1], ARGV[2], '0', ARGV[3], ARGV[4], ARGV[5]})
if attempts < 0 then return -1 end
charge_unkept(ARGV[1], ARGV[7], ARGV[8], ARGV[9], ARGV[10])
if attempts > tonumber(ARGV[6]) then
  fail_item({ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]})
else
  release_item({ARGV[1], ARGV[2]})
end
return attempts
