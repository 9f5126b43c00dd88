-- prune_active: drop a job from the active-jobs index unless it has been run since it was
-- seen idle. set_state lists a job with score 0 before moving it to running and with its new
-- run epoch after, so an entry scored at or below the epoch seen is stale (a pre-listing
-- whose run was refused, or the idle job itself).
-- KEYS[1] <prefix>:jobs:active (ZSET job id -> run epoch)
-- ARGV[1] job_id   ARGV[2] the run epoch seen while idle ('-1' = the job is gone)
-- Returns 1 if removed, else 0.
local epoch = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not epoch then return 0 end
if ARGV[2] ~= '-1' and tonumber(epoch) > tonumber(ARGV[2]) then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])
