-- complete_item: save the owner's result and mark its running item completed.
-- KEYS: the job's keys and the buckets of the item and its duplicates (_job.lua); writes META,
--       STATES, RESULTS, LEASES, OWNERS, ANSWERS, AKEYS, CONTENTS, and the item's (and its
--       duplicates') sources record, which nothing reads once an item is completed (it is never
--       processed again).
-- ARGV[1] index   ARGV[2] worker_id   ARGV[3] result   ARGV[4] tokens_in ('' = unreported)
-- ARGV[5] tokens_out ('' = unreported)   ARGV[6] provider ('' = none)   ARGV[7] model ('' = none)
-- ARGV[8] the job id (the answer index names it)   ARGV[9] cached input tokens ('' = unreported)
-- ARGV[10] its cost, ARGV[11] the same at the list price (nano-USD; jobs/prices.py), added as
-- the digits they are: a Lua number is a double, inexact past 2^53
-- ARGV[12] input tokens written to the prompt cache ('' = unreported)
-- Its duplicates (DUPS) complete with the same result, nothing charged, and the answer index
-- points the item's answer key at it.
-- Returns 1, or 0 when worker_id does not hold the item (a completed item is never
-- completed again: it has no owner).
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local idx = ARGV[1]
need_buckets(with_duplicates(idx))
if not owned_by(idx, ARGV[2]) then return 0 end
local reported = ARGV[4] ~= '' or ARGV[5] ~= ''
local tokens_in, tokens_out = tonumber(ARGV[4]) or 0, tonumber(ARGV[5]) or 0
local cached, cost, list_cost = tonumber(ARGV[9]) or 0, tonumber(ARGV[10]), tonumber(ARGV[11])
local written = tonumber(ARGV[12]) or 0
local st, reserved, reserved_cost = unlease(idx)
-- Without a reported usage the bill is unknown: the item is charged what its claim held, its
-- worst case in tokens and, under --max-cost, in money (as sqlite/settling.py _complete).
local cost_digits = ARGV[10]
if not reported and reserved_cost > cost then cost, cost_digits = reserved_cost, digits(reserved_cost) end
-- An item's tokens and cost add to what its attempts not kept were billed (charge_unkept).
st.s, st.w = S_COMPLETED, 0
st.ti, st.to = (st.ti or 0) + tokens_in, (st.to or 0) + tokens_out
if cached > 0 then st.tc = cached end
if written > 0 then st.tw = written end
if cost > 0 then st.c = add_digits(st.c, cost_digits) end  -- as text: exact past 14 digits
if ARGV[6] ~= '' then st.pv = ARGV[6] end
if ARGV[7] ~= '' then st.md = ARGV[7] end
save_state(idx, st)
redis.call('HSET', at('results', idx), idx, ARGV[3])
redis.call('HDEL', at('sources', idx), idx)
local charged = reserved
if reported then charged = tokens_in + tokens_out end
local dups = redis.call('ZRANGEBYSCORE', DUPS, idx, idx)
for _, d in ipairs(dups) do
  local dst = item_state(d)
  dst.s, dst.ti, dst.to = S_COMPLETED, 0, 0
  if ARGV[6] ~= '' then dst.pv = ARGV[6] end
  if ARGV[7] ~= '' then dst.md = ARGV[7] end
  save_state(d, dst)
  redis.call('HSET', at('results', d), d, ARGV[3])
  redis.call('HDEL', at('sources', d), d)
end
if #dups > 0 then
  redis.call('ZREMRANGEBYSCORE', DUPS, idx, idx)
  meta_decr('pending', #dups)
end
local key = redis.call('HGET', at('keys', idx), idx)
if key then
  redis.call('HSET', ANSWERS, key, ARGV[8] .. '\t' .. idx .. '\t' .. charged .. '\t' .. cost_digits)
  -- Its "k:" entry served create only (duplicates find their item); the keys bucket's entry
  -- stays (delete_job).
  redis.call('HDEL', AKEYS, 'k:' .. key)
  -- Nothing reads a completed item's content again: where the job drops contents, its bytes go
  -- (the items with its content are its duplicates, completed just above).
  if redis.call('HGET', META, 'drop_content') == '1' then
    local _, content_hash = item_head(idx)
    redis.call('HDEL', CONTENTS, content_hash)
  end
end
redis.call('HINCRBY', META, 'running', -1)
redis.call('HINCRBY', META, 'completed', 1 + #dups)
release_reservations(reserved, reserved_cost)
redis.call('HINCRBY', META, 'tokens_charged', charged)
redis.call('HINCRBY', META, 'tokens_in', tokens_in)
redis.call('HINCRBY', META, 'tokens_out', tokens_out)
if cached > 0 then redis.call('HINCRBY', META, 'tokens_cached', cached) end
if written > 0 then redis.call('HINCRBY', META, 'tokens_written', written) end
if cost > 0 then redis.call('HINCRBY', META, 'cost', cost_digits) end
if list_cost > 0 then redis.call('HINCRBY', META, 'list_cost', ARGV[11]) end
return 1
