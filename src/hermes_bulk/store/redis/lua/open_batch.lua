-- open_batch: start a batch of a running job, or take over the one being prepared (protocol.open_batch).
-- KEYS: the job's keys (_job.lua); KEYS[14] the job's batches hash, KEYS[15] P:jobs:batched;
--       then the buckets of the items it takes.
-- ARGV[1] batch_id   ARGV[2] worker_id   ARGV[3] max_items   ARGV[4] lease_ms   ARGV[5] hold_ms
-- ARGV[6] the owner prefix of batch items ("batch:")   ARGV[7] job id
-- ARGV[8] take_from: a worker the caller found dead, whose preparing lease is taken at once ('' = none)
-- Returns {reason} when refused, else {'ok', batch record JSON}.
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local BATCHES, BATCHED = KEYS[14], KEYS[15]
local flat = redis.call('HGETALL', META)
if #flat == 0 then return {'no_job'} end
local job = {}
for i = 1, #flat, 2 do job[flat[i]] = flat[i + 1] end
if job.state ~= S_RUNNING then return {'not_running'} end
local now = now_ms()
local worker, lease_until = ARGV[2], (now + tonumber(ARGV[4])) / 1000

for _, raw in ipairs(redis.call('HVALS', BATCHES)) do
  local b = cjson.decode(raw)
  if b.status == 'preparing' then
    if b.lease_owner and b.lease_owner ~= worker and b.lease_owner ~= ARGV[8] and b.lease_until >= now / 1000 then
      return {'batch_preparing'}
    end
    b.lease_owner, b.lease_until = worker, lease_until
    local enc = cjson.encode(b)
    redis.call('HSET', BATCHES, b.batch_id, enc)
    return {'ok', enc}
  end
end

local idxs = redis.call('ZRANGE', PENDING, 0, tonumber(ARGV[3]) - 1)
if #idxs == 0 then return {'no_pending'} end
need_buckets(idxs)
local limit = nil
if job.max_tokens ~= '' then limit = tonumber(job.max_tokens) end
local charged = tonumber(job.tokens_charged)
local used = charged + tonumber(job.tokens_reserved)
-- --max-cost: each item's reservation at the batch price, while the sum fits.
local max_cost, rates = cost_limit(job)
local spent = tonumber(job.cost or '0')
local spent_and_held = spent + tonumber(job.cost_reserved or '0')
local out_bound = output_bound(job)
local reserved_costs = 0
local owner = ARGV[6] .. ARGV[1]
local hold_until = now + tonumber(ARGV[5])
local taken, reserved = 0, 0
for _, idx in ipairs(idxs) do
  local estimate = item_head(idx)  -- its worst case, as claim_item reserves it
  if limit and not fits(used, estimate, limit) then
    if taken > 0 then break end
    return refuse_over_limit(now, charged, estimate, idx, limit)
  end
  local cost = 0
  if max_cost then
    cost = reserved_cost(estimate, out_bound, rates[3], rates[4])
    if not fits(spent_and_held, cost, max_cost) then
      if taken > 0 then break end
      return refuse_over_cost(now, spent, cost, idx, max_cost)
    end
  end
  used, spent_and_held = used + estimate, spent_and_held + cost
  reserved_costs = reserved_costs + cost
  local st = item_state(idx)
  st.s, st.r = S_CLAIMED, estimate
  if cost > 0 then st.rc = digits(cost) end
  save_state(idx, st)
  redis.call('ZREM', PENDING, idx)
  redis.call('ZADD', LEASES, hold_until, idx)
  redis.call('HSET', OWNERS, idx, owner)
  taken, reserved = taken + 1, reserved + estimate
end
meta_decr('pending', taken)
redis.call('HINCRBY', META, 'running', taken)
redis.call('HINCRBY', META, 'tokens_reserved', reserved)
if reserved_costs > 0 then redis.call('HINCRBY', META, 'cost_reserved', digits(reserved_costs)) end
redis.call('HSET', META, 'last_claim_at_ms', fmt_ms(now))
local record = cjson.encode({batch_id = ARGV[1], job_id = ARGV[7], status = 'preparing', items = taken,
                             created_at = now / 1000, lease_owner = worker, lease_until = lease_until})
redis.call('HSET', BATCHES, ARGV[1], record)
redis.call('SADD', BATCHED, ARGV[7])
return {'ok', record}
