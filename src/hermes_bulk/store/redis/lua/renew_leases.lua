-- renew_leases: extend the leases of the named items of this job that worker_id still holds.
-- KEYS: the job's keys (_job.lua); reads OWNERS, writes LEASES.
-- ARGV[1] worker_id   ARGV[2] lease_ms   ARGV[3..] item indexes the worker is working on
-- Returns how many leases were extended (an item given away in the meantime is skipped).
local expires_ms = now_ms() + tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  if redis.call('HGET', OWNERS, ARGV[i]) == ARGV[1] then
    redis.call('ZADD', LEASES, 'XX', expires_ms, ARGV[i])
    n = n + 1
  end
end
return n
