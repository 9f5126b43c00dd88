-- release_worker_items: return every item of this job that worker_id holds to pending.
-- KEYS: the job's keys and the buckets of the items it releases (_job.lua); writes META, STATES,
--       PENDING, LEASES, OWNERS, EVENTS.
-- ARGV[1] worker_id (known dead, or stopping)
-- Returns how many were released.
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local owners = redis.call('HGETALL', OWNERS)
local held = {}
for i = 1, #owners, 2 do
  if owners[i + 1] == ARGV[1] then held[#held + 1] = owners[i] end
end
need_buckets(held)
local n, reserved, reserved_cost = #held, 0, 0
for _, idx in ipairs(held) do
  local r, rc = requeue(idx)
  reserved, reserved_cost = reserved + r, reserved_cost + rc
end
if n > 0 then
  count_released(n, reserved, reserved_cost)
  released_event(now_ms(), n, ARGV[1])
end
return n
