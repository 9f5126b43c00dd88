-- record_attempt: count a failed attempt of the owner's item and record it as an event.
-- KEYS: the job's keys and the item's buckets (_job.lua); writes STATES, EVENTS.
-- ARGV[1] index   ARGV[2] worker_id   ARGV[3] '1' if rate limited (a 429), else '0'
-- ARGV[4] error_type   ARGV[5] http_status ('' = none)   ARGV[6] message
-- Returns the new count of that kind (a transient failure also ends a run of 429s), or -1
-- when worker_id does not hold the item.
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local idx = ARGV[1]
if not owned_by(idx, ARGV[2]) then return -1 end
local st = item_state(idx)
local count, kind
if ARGV[3] == '1' then
  st.w = (st.w or 0) + 1
  count, kind = st.w, 'rate_limited'
else
  st.a, st.w = (st.a or 0) + 1, 0
  count, kind = st.a, 'attempt_failed'
end
save_state(idx, st)
add_event(now_ms(), kind, ARGV[6], tonumber(idx), ARGV[4], tonumber(ARGV[5]))
return count
