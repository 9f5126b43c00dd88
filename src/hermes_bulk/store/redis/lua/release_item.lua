-- release_item: return the owner's running item to pending, nothing charged.
-- KEYS: the job's keys and the item's buckets (_job.lua); writes META, STATES, PENDING, LEASES,
--       OWNERS.
-- ARGV[1] index   ARGV[2] worker_id
-- Returns 1, or 0 when worker_id does not hold the item.
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
if not owned_by(ARGV[1], ARGV[2]) then return 0 end
count_released(1, requeue(ARGV[1]))
return 1
