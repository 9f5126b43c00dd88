-- delete_job: remove every key of a job (UNLINK frees large hashes off the main thread).
-- KEYS: the job's keys (_job.lua); deletes all ten.
-- ARGV: none.
-- Returns 1 if the job existed, else 0.
local existed = redis.call('EXISTS', META)
redis.call('UNLINK', unpack(KEYS))
return existed
