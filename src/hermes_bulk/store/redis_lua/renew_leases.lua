-- renew_leases: extend the lease of every item of this job that worker_id holds.
-- KEYS: the job's keys (_job.lua); reads OWNERS, writes LEASES.
-- ARGV[1] worker_id   ARGV[2] lease_ms
-- Returns how many leases were extended. OWNERS holds only running items (at most the
-- job's concurrency), so the scan is short.
local owners = redis.call('HGETALL', OWNERS)
local expires_ms = now_ms() + tonumber(ARGV[2])
local n = 0
for i = 1, #owners, 2 do
  if owners[i + 1] == ARGV[1] then
    redis.call('ZADD', LEASES, 'XX', expires_ms, owners[i])
    n = n + 1
  end
end
return n
