-- _job.lua: prepended to every per-job script.
--
-- KEYS start with the job's twelve keys and the store's answer index, in this order
-- (RedisKeys.job builds them; all share the hash tag {<prefix>:job:<id>}, so a job's script
-- touches one cluster slot):
--   KEYS[1] meta      KEYS[2] items    KEYS[3] states   KEYS[4] contents  KEYS[5] results
--   KEYS[6] pending   KEYS[7] leases   KEYS[8] owners   KEYS[9] failed    KEYS[10] events
--   KEYS[11] keys     KEYS[12] dups    KEYS[13] answers (P:answers, shared by every job)
-- then a script's own keys (open_batch's two), then the buckets of the items it touches: six
-- keys a bucket, one per family (RedisKeys.bucket_keys), in any order.
-- ITEMS, STATES and RESULTS are layout 1's per-item hashes (only migrate_layout reads them); an
-- item's records are in the buckets `at` names, and a script's header saying it writes STATES
-- or RESULTS means the item's bucket of that family.
local META, ITEMS, STATES, CONTENTS, RESULTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local PENDING, LEASES, OWNERS, FAILED, EVENTS = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local AKEYS, DUPS, ANSWERS = KEYS[11], KEYS[12], KEYS[13]

-- Subtract n from a META counter. Not HINCRBY by -n: for n = 0 Lua's -n is -0, which reaches
-- Redis as "-0" and is refused ("value is not an integer"), failing the whole operation.
local function meta_decr(field, n)
  if n ~= 0 then redis.call('HINCRBY', META, field, -n) end
end

-- The per-item records live in buckets of BUCKET_ITEMS indexes, one hash per family and bucket
-- ("<job's tag>:<family>:<index // BUCKET_ITEMS>", keys.py): small hashes of short values, which
-- Redis keeps as listpacks. They share the job's hash tag, so they are in its slot.
local JOB = string.sub(META, 1, #META - 4)  -- META is "<job's tag>:meta"
local function at(family, idx)
  return JOB .. family .. ':' .. math.floor(tonumber(idx) / BUCKET_ITEMS)
end

-- Every key a script touches is passed in KEYS, as Redis asks (a cluster refuses a key it was
-- not told of). The caller passes the buckets of the items it names (the suite's key check,
-- scripts.py, holds it to that); a script that chooses its items itself (the lowest pending,
-- the expired leases, an item's duplicates) calls need_buckets on them before it writes
-- anything, which ends the script with the error
-- "NEEDKEYS <bucket> ..." when some of their buckets were not passed: the caller calls again
-- with them (scripts.py: call_job_script). A caller always passes a bucket's six keys, so one
-- family stands for them here.
local DECLARED = {}
for i = 14, #KEYS do DECLARED[KEYS[i]] = true end
local function need_buckets(idxs)
  local missing, seen = {}, {}
  for _, idx in ipairs(idxs) do
    local b = math.floor(tonumber(idx) / BUCKET_ITEMS)
    if not seen[b] and not DECLARED[JOB .. 'states:' .. b] then
      seen[b] = true
      missing[#missing + 1] = b
    end
  end
  if #missing > 0 then error({err = 'NEEDKEYS ' .. table.concat(missing, ' ')}) end
end

-- The items a completion or a failure of idx touches: idx and the duplicates waiting on it.
local function with_duplicates(idx)
  local idxs = redis.call('ZRANGEBYSCORE', DUPS, idx, idx)
  idxs[#idxs + 1] = idx
  return idxs
end

-- The item claim_item would take: the hint if it is pending, else the lowest pending index
-- (O(log n) either way); nil when nothing is pending.
-- run --sample: the indexes claims are limited to (META "sample", a JSON array, lowest first),
-- or nil.
local function job_sample()
  local raw = redis.call('HGET', META, 'sample')
  if not raw then return nil end
  return cjson.decode(raw)
end

local function claim_candidate(hint)
  local sample = job_sample()
  if sample then  -- the lowest pending index of the sample (as SqliteJobStore's claim)
    for _, idx in ipairs(sample) do
      local field = string.format('%d', idx)
      if redis.call('ZSCORE', PENDING, field) then return field end
    end
    return nil
  end
  if redis.call('ZSCORE', PENDING, hint) then return hint end
  return redis.call('ZRANGE', PENDING, 0, 0)[1]
end

-- The estimate and the content hash (as the contents hash's field: codec.content_field) of an
-- item: its items record "<estimate>\t<content field>", written once by add_items.
local function item_head(idx)
  local estimate, content_hash = string.match(redis.call('HGET', at('items', idx), idx), '^(%-?%d+)\t(.*)$')
  return tonumber(estimate), content_hash
end

-- A provider or model name as a small number, the same for the job's every item: META holds
-- "n:<id>" -> name and "n=<name>" -> id (an item's state stays short).
local function intern(name)
  local id = redis.call('HGET', META, 'n=' .. name)
  if id then return tonumber(id) end
  id = redis.call('HINCRBY', META, 'names', 1)
  redis.call('HSET', META, 'n=' .. name, id, 'n:' .. id, name)
  return id
end

-- An item's changing fields (st.s, st.a, ...: their legend is store/redis/item_state.py); absent
-- means a fresh pending item. Stored short (under 64 bytes, the listpack's value limit): the
-- status as a digit (STATUS_CODE), provider and model interned, the counts in ZERO_OMITTED
-- (item_state.py) left out at 0.
local function item_state(idx)
  local raw = redis.call('HGET', at('states', idx), idx)
  if not raw then return {s = S_PENDING, a = 0, w = 0, r = 0} end
  local st = cjson.decode(raw)
  st.s = STATUS_NAME[st.s] or st.s
  st.a, st.w, st.r = st.a or 0, st.w or 0, st.r or 0
  return st
end

local function save_state(idx, st)
  local stored = {}
  for k, v in pairs(st) do stored[k] = v end
  stored.s = STATUS_CODE[st.s] or st.s
  if type(st.pv) == 'string' then stored.pv = intern(st.pv) end
  if type(st.md) == 'string' then stored.md = intern(st.md) end
  for _, k in ipairs(ZERO_OMITTED) do
    if stored[k] == 0 then stored[k] = nil end
  end
  redis.call('HSET', at('states', idx), idx, cjson.encode(stored))
end

-- Events are "<at_ms>\t<JSON [kind, message, index, error_type, http_status]>", newest kept.
local function add_event(at_ms, kind, message, idx, error_type, http_status)
  local null = cjson.null
  local body = cjson.encode({kind, message, idx or null, error_type or null, http_status or null})
  redis.call('RPUSH', EVENTS, fmt_ms(at_ms) .. '\t' .. body)
  redis.call('LTRIM', EVENTS, -EVENTS_KEPT, -1)
end

local function owned_by(idx, worker_id)
  return redis.call('HGET', OWNERS, idx) == worker_id
end

-- Take a running item off its lease; returns its state (reservations cleared) and its
-- reservations: tokens, and nano-USD under --max-cost (st.rc, digits: exact past 14 of them).
local function unlease(idx)
  redis.call('ZREM', LEASES, idx)
  redis.call('HDEL', OWNERS, idx)
  local st = item_state(idx)
  local reserved, reserved_cost = st.r or 0, tonumber(st.rc or '0')
  st.r, st.rc = 0, nil
  return st, reserved, reserved_cost
end

-- A running item back to pending, nothing charged; returns the reservations it held.
local function requeue(idx)
  local st, reserved, reserved_cost = unlease(idx)
  st.s = S_PENDING
  save_state(idx, st)
  redis.call('ZADD', PENDING, idx, idx)
  return reserved, reserved_cost
end

-- An integer as digits (a Lua number reaches Redis with 14 significant digits only).
local function digits(n)
  return string.format('%d', n)
end

-- Two counts given as digits (ARGV, an item's cost), added as digits: exact at any size, where a
-- Lua number is exact below 2^53 only. nil counts as 0.
local function add_digits(a, b)
  a, b = a or '0', b or '0'
  local out, carry, i, j = {}, 0, #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local sum = carry + (tonumber(string.sub(a, i, i)) or 0) + (tonumber(string.sub(b, j, j)) or 0)
    out[#out + 1], carry = sum % 10, math.floor(sum / 10)
    i, j = i - 1, j - 1
  end
  return string.reverse(table.concat(out))
end

-- What the provider billed for an answer not kept (protocol: settle_failed_attempt), charged to
-- the item (its tokens and cost count every billed attempt) and to the job, apart as well.
-- tin, tout: the reported tokens ('' or nil = unreported: nothing is charged); cost, list_cost:
-- nano-USD as digits (HINCRBY and add_digits add them exactly).
local function charge_unkept(idx, tin, tout, cost, list_cost)
  if (tin or '') == '' and (tout or '') == '' then return end
  local tokens = (tonumber(tin) or 0) + (tonumber(tout) or 0)
  local st = item_state(idx)
  st.ti, st.to = (st.ti or 0) + (tonumber(tin) or 0), (st.to or 0) + (tonumber(tout) or 0)
  if tonumber(cost) > 0 then st.c = add_digits(st.c, cost) end
  save_state(idx, st)
  redis.call('HINCRBY', META, 'tokens_charged', tokens)
  redis.call('HINCRBY', META, 'tokens_unkept', tokens)
  if tonumber(cost) > 0 then
    redis.call('HINCRBY', META, 'cost', cost)
    redis.call('HINCRBY', META, 'cost_unkept', cost)
  end
  if tonumber(list_cost) > 0 then redis.call('HINCRBY', META, 'list_cost', list_cost) end
end

local function release_reservations(reserved, reserved_cost)
  meta_decr('tokens_reserved', reserved)
  if reserved_cost > 0 then redis.call('HINCRBY', META, 'cost_reserved', digits(-reserved_cost)) end
end

local function count_released(n, reserved, reserved_cost)
  meta_decr('running', n)
  redis.call('HINCRBY', META, 'pending', n)
  release_reservations(reserved, reserved_cost)
end

-- Items taken back from workers (expired or dead) are recorded, like the SQLite store does;
-- worker: the one whose items they were, when known.
local function released_event(now, n, worker)
  add_event(now, 'recovered', string.format('%d interrupted item%s returned to the queue', n, n == 1 and '' or 's')
    .. (worker and (' from worker ' .. worker) or ''))
end

-- The most output tokens an answer of the job may bill (records.JobSpec.output_bound): the
-- max_tokens its requests carry, else (a job made before every request carried one) its
-- output estimate. Plain META fields (begin_job); a job begun by an older version has them in
-- its spec only.
local function output_bound(job)
  local cap = tonumber(job.max_output_tokens)
  if cap then return cap end
  local fixed = tonumber(job.output_tokens_estimate)
  if fixed then return fixed end
  local spec = cjson.decode(job.spec)
  if type(spec.max_output_tokens) == 'number' then return spec.max_output_tokens end
  return spec.output_tokens_estimate
end

-- No item of the sample is pending: while one still runs (has an owner), nothing to claim; once
-- every one has settled, the job pauses and the sample is cleared (as sqlite/claims.py _end_sample).
local function end_sample(now, sample)
  for _, idx in ipairs(sample) do
    if redis.call('HEXISTS', OWNERS, string.format('%d', idx)) == 1 then return {'no_pending'} end
  end
  redis.call('HSET', META, 'state', S_PAUSED, 'pause_reason', PAUSE_SAMPLE)
  redis.call('HDEL', META, 'sample')
  add_event(now, 'paused', string.format(SAMPLE_DONE, #sample))
  return {'sample_done'}
end

-- store/claim_rule.py's fits, copied: need fits beside used under limit while used + need <=
-- limit (a reservation that reaches the limit exactly fits). Every limit a claim or a batch
-- checks is compared here only.
local function fits(used, need, limit)
  return used + need <= limit
end

-- --max-cost: the job's limit (nano-USD) and the rates its claims reserve at (USD per million
-- tokens: live input, output, then a batch's; META cost_rates, written with max_cost from
-- records.cost_rates), or nil without a limit.
local function cost_limit(job)
  if (job.max_cost or '') == '' then return nil end
  local rates = {}
  for rate in string.gmatch(job.cost_rates or '', '%S+') do rates[#rates + 1] = tonumber(rate) end
  for i = 1, 4 do rates[i] = rates[i] or 0 end  -- a limit without a price: nothing to reserve
  return tonumber(job.max_cost), rates
end

-- records.reserved_cost, copied: the same double operations in the same order, so both
-- backends reserve the same nano-dollars. tokens: the item's worst case (what its claims
-- reserve); out_bound: output_bound(job).
local function reserved_cost(tokens, out_bound, rate_in, rate_out)
  local out = math.min(out_bound, tokens)
  return math.ceil(((tokens - out) * rate_in + out * rate_out) * 1000)
end

-- records.usd_text and cost_limit_reached, copied (exact below 2^53 nano-USD, $9M).
-- math.fmod is C's fmod, exact; Lua's % and a floor of nusd / 1e9 round near 2^53.
local function usd_text(nusd)
  local rest = math.fmod(nusd, 1e9)
  local frac = string.gsub(string.format('%09d', rest), '0+$', '')
  return '$' .. digits((nusd - rest) / 1e9) .. '.' .. frac .. string.rep('0', 2 - #frac)
end

-- An item whose cost does not fit under --max-cost beside what is spent and reserved: as
-- refuse_over_limit, in money.
local function refuse_over_cost(now, spent, need, idx, limit)
  if fits(spent, need, limit) then return {'cost_in_flight'} end
  redis.call('HSET', META, 'state', S_PAUSED, 'pause_reason', PAUSE_COST_LIMIT)
  add_event(now, 'paused', 'cost limit reached: ' .. usd_text(spent) .. ' spent + ' .. usd_text(need)
    .. ' for item ' .. (tonumber(idx) + 1) .. ' would exceed --max-cost ' .. usd_text(limit), tonumber(idx))
  return {'cost_limit'}
end

-- An item that does not fit under --max-tokens: it waits while reservations in flight may settle
-- for less; the job pauses only when it would not fit beside what is charged alone
-- (store/claim_rule.py refusal).
local function refuse_over_limit(now, charged, estimate, idx, limit)
  if fits(charged, estimate, limit) then return {'tokens_in_flight'} end
  redis.call('HSET', META, 'state', S_PAUSED, 'pause_reason', PAUSE_TOKEN_LIMIT)
  add_event(now, 'paused', string.format(
    'token limit reached: %d charged + %d for item %d would exceed --max-tokens %d',
    charged, estimate, tonumber(idx) + 1, limit), tonumber(idx))
  return {'token_limit'}
end
