-- release_expired: return every running item of this job whose lease has expired to pending.
-- KEYS: the job's keys and the buckets of the items it releases (_job.lua); writes META, STATES,
--       PENDING, LEASES, OWNERS, EVENTS.
-- ARGV: none.
-- Returns {released, idle, run_epoch}: idle is 1 when the job is gone, or is not running and
-- holds no leases (so it may leave the active-jobs index if its epoch has not moved since).
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local state = redis.call('HGET', META, 'state')
if not state then return {0, 1, -1} end
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', LEASES, '-inf', '(' .. fmt_ms(now))
need_buckets(due)
if #due > 0 then
  local reserved = 0
  local reserved_cost = 0
  for _, idx in ipairs(due) do
    local r, rc = requeue(idx)
    reserved, reserved_cost = reserved + r, reserved_cost + rc
  end
  count_released(#due, reserved, reserved_cost)
  released_event(now, #due)
end
local idle = 0
if state ~= S_RUNNING and redis.call('HLEN', OWNERS) == 0 then idle = 1 end
return {#due, idle, tonumber(redis.call('HGET', META, 'run_epoch'))}
