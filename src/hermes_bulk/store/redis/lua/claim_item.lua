-- claim_item: give one pending item of a running job to a worker until now + lease.
-- KEYS: the job's keys and the buckets of the item it takes (_job.lua); reads CONTENTS and the
--       item's items, names and sources records; writes META, its state, PENDING, LEASES, OWNERS,
--       EVENTS.
-- ARGV[1] index_hint   ARGV[2] worker_id   ARGV[3] lease_ms   ARGV[4] max_running
-- Returns {reason} when refused (no_job, not_running, at_capacity, no_pending, tokens_in_flight,
-- token_limit, cost_in_flight, cost_limit, sample_done: the job's run --sample has settled, and it paused),
-- else {'ok', job (HGETALL of META before the claim), index, content hash, name, source (JSON
-- [origin, offset, stat_sig]), state JSON or false, content}.
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local flat = redis.call('HGETALL', META)
if #flat == 0 then return {'no_job'} end
local job = {}
for i = 1, #flat, 2 do job[flat[i]] = flat[i + 1] end
if job.state ~= S_RUNNING then return {'not_running'} end
if tonumber(job.running) >= math.min(tonumber(job.concurrency), tonumber(ARGV[4])) then
  return {'at_capacity'}
end

local idx = claim_candidate(ARGV[1])
if not idx then
  local sample = job_sample()
  if sample then return end_sample(now_ms(), sample) end
  return {'no_pending'}
end
need_buckets({idx})
-- An item reserves its worst case, recorded at create (the reservation rule: records.NewItem
-- claim_tokens; SQLite's copy is store/sqlite/reservations.py).
local estimate, content_hash = item_head(idx)
local now = now_ms()

-- --max-tokens: charged + reserved + estimate must fit. When it does not, the item waits while
-- reservations are in flight (they may settle for less); the job pauses only when the item
-- would not fit beside what is charged alone (store/claim_rule.py; SQLite: sqlite/claims.py).
if job.max_tokens ~= '' then
  local limit = tonumber(job.max_tokens)
  local charged, reserved = tonumber(job.tokens_charged), tonumber(job.tokens_reserved)
  if not fits(charged + reserved, estimate, limit) then
    return refuse_over_limit(now, charged, estimate, idx, limit)
  end
end
-- --max-cost: the same in money, the item's reservation at the live price.
local cost = 0
local max_cost, rates = cost_limit(job)
if max_cost then
  cost = reserved_cost(estimate, output_bound(job), rates[1], rates[2])
  local spent = tonumber(job.cost or '0')
  if not fits(spent + tonumber(job.cost_reserved or '0'), cost, max_cost) then
    return refuse_over_cost(now, spent, cost, idx, max_cost)
  end
end

local raw_state = redis.call('HGET', at('states', idx), idx)
local st = item_state(idx)
st.s, st.r = S_CLAIMED, estimate
if cost > 0 then st.rc = digits(cost) end
save_state(idx, st)
redis.call('ZREM', PENDING, idx)
redis.call('ZADD', LEASES, now + tonumber(ARGV[3]), idx)
redis.call('HSET', OWNERS, idx, ARGV[2])
redis.call('HINCRBY', META, 'pending', -1)
redis.call('HINCRBY', META, 'running', 1)
redis.call('HINCRBY', META, 'tokens_reserved', estimate)
if cost > 0 then redis.call('HINCRBY', META, 'cost_reserved', digits(cost)) end
redis.call('HSET', META, 'last_claim_at_ms', fmt_ms(now))
return {'ok', flat, idx, content_hash, redis.call('HGET', at('names', idx), idx),
        redis.call('HGET', at('sources', idx), idx), raw_state or false, redis.call('HGET', CONTENTS, content_hash)}
