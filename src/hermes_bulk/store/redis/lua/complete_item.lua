-- complete_item: save the owner's result and mark its running item completed.
-- KEYS: the job's keys (_job.lua); writes META, STATES, RESULTS, LEASES, OWNERS.
-- ARGV[1] index   ARGV[2] worker_id   ARGV[3] result   ARGV[4] tokens_in ('' = unreported)
-- ARGV[5] tokens_out ('' = unreported)   ARGV[6] provider ('' = none)   ARGV[7] model ('' = none)
-- Returns 1, or 0 when worker_id does not hold the item (a completed item is never
-- completed again: it has no owner).
local idx = ARGV[1]
if not owned_by(idx, ARGV[2]) then return 0 end
local reported = ARGV[4] ~= '' or ARGV[5] ~= ''
local tokens_in, tokens_out = tonumber(ARGV[4]) or 0, tonumber(ARGV[5]) or 0
local st, reserved = unlease(idx)
st.s, st.ti, st.to, st.w = S_COMPLETED, tokens_in, tokens_out, 0
if ARGV[6] ~= '' then st.pv = ARGV[6] end
if ARGV[7] ~= '' then st.md = ARGV[7] end
save_state(idx, st)
redis.call('HSET', RESULTS, idx, ARGV[3])
local charged = reserved
if reported then charged = tokens_in + tokens_out end
redis.call('HINCRBY', META, 'running', -1)
redis.call('HINCRBY', META, 'completed', 1)
meta_decr('tokens_reserved', reserved)
redis.call('HINCRBY', META, 'tokens_charged', charged)
redis.call('HINCRBY', META, 'tokens_in', tokens_in)
redis.call('HINCRBY', META, 'tokens_out', tokens_out)
return 1
