-- fail_item: mark the owner's running item failed with an error, and record an event.
-- KEYS: the job's keys and the buckets of the item and its duplicates (_job.lua); writes META,
--       STATES, LEASES, OWNERS, FAILED, EVENTS.
-- ARGV[1] index   ARGV[2] worker_id   ARGV[3] error_type   ARGV[4] http_status ('' = none)
-- ARGV[5] message (our own text, never the provider's)
-- ARGV[6] tokens_in, ARGV[7] tokens_out the provider billed for the answer that failed ('' or
-- absent = none: nothing charged), ARGV[8] its cost, ARGV[9] at the list price (nano-USD digits):
-- charged as an answer not kept (charge_unkept)
-- Its duplicates (DUPS) fail with the same error.
-- Returns 1, or 0 when worker_id does not hold the item.
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local idx = ARGV[1]
need_buckets(with_duplicates(idx))
if not owned_by(idx, ARGV[2]) then return 0 end
local st, reserved, reserved_cost = unlease(idx)
st.s, st.et, st.hs, st.em = S_FAILED, ARGV[3], tonumber(ARGV[4]), ARGV[5]
save_state(idx, st)
redis.call('ZADD', FAILED, idx, idx)
local dups = redis.call('ZRANGEBYSCORE', DUPS, idx, idx)
for _, d in ipairs(dups) do
  local dst = item_state(d)
  dst.s, dst.et, dst.hs, dst.em = S_FAILED, ARGV[3], tonumber(ARGV[4]), ARGV[5]
  save_state(d, dst)
  redis.call('ZADD', FAILED, d, d)
end
if #dups > 0 then
  redis.call('ZREMRANGEBYSCORE', DUPS, idx, idx)
  meta_decr('pending', #dups)
end
redis.call('HINCRBY', META, 'running', -1)
redis.call('HINCRBY', META, 'failed', 1 + #dups)
release_reservations(reserved, reserved_cost)
add_event(now_ms(), 'item_failed', ARGV[5], tonumber(idx), ARGV[3], tonumber(ARGV[4]))
charge_unkept(idx, ARGV[6], ARGV[7], ARGV[8], ARGV[9])
return 1
