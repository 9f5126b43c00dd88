-- update_job: set a job's concurrency, rpm and tpm (run/resume --concurrency, --rpm, --tpm).
-- KEYS: the job's keys (_job.lua); writes META.
-- ARGV[1] concurrency   ARGV[2] rpm   ARGV[3] tpm   ('' = unchanged)
-- The values live in META beside the spec JSON (claim_item reads concurrency there; the
-- codec lays rpm and tpm over the spec), so the spec text is never rewritten in Lua.
-- Returns 1, or false when the job is unknown or still being created.
local state = redis.call('HGET', META, 'state')
if not state or state == S_CREATING then return false end
if ARGV[1] ~= '' then redis.call('HSET', META, 'concurrency', ARGV[1]) end
if ARGV[2] ~= '' then redis.call('HSET', META, 'rpm', ARGV[2]) end
if ARGV[3] ~= '' then redis.call('HSET', META, 'tpm', ARGV[3]) end
return 1
