-- release_worker_items: return every item of this job that worker_id holds to pending.
-- KEYS: the job's keys (_job.lua); writes META, STATES, PENDING, LEASES, OWNERS, EVENTS.
-- ARGV[1] worker_id (known dead, or stopping)
-- Returns how many were released.
local owners = redis.call('HGETALL', OWNERS)
local n, reserved = 0, 0
for i = 1, #owners, 2 do
  if owners[i + 1] == ARGV[1] then
    reserved = reserved + requeue(owners[i])
    n = n + 1
  end
end
if n > 0 then
  count_released(n, reserved)
  released_event(now_ms(), n, ARGV[1])
end
return n
