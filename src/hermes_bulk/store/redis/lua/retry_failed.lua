-- retry_failed: return up to ARGV[1] failed items to pending, clearing errors and counts.
-- KEYS: the job's keys and the buckets of the items it returns (_job.lua); writes META, STATES,
--       PENDING, FAILED.
-- ARGV[1] how many at most (the caller repeats until fewer come back, so one call never
--         holds Redis for a million items)
-- Returns the number returned to pending.
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local idxs = redis.call('ZRANGE', FAILED, 0, tonumber(ARGV[1]) - 1)
need_buckets(idxs)
for _, idx in ipairs(idxs) do
  local st = item_state(idx)
  st.s, st.a, st.w, st.et, st.hs, st.em = S_PENDING, 0, 0, nil, nil, nil
  if st.d then  -- a duplicate waits on its item again (asked once more)
    st.s = S_WAITING
    redis.call('ZADD', DUPS, st.d, idx)
  else
    redis.call('ZADD', PENDING, idx, idx)
  end
  save_state(idx, st)
end
if #idxs > 0 then
  redis.call('ZREMRANGEBYRANK', FAILED, 0, #idxs - 1)
  redis.call('HINCRBY', META, 'failed', -#idxs)
  redis.call('HINCRBY', META, 'pending', #idxs)
end
return #idxs
