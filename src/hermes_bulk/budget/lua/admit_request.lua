-- admit_request: decide on one provider request, count it and record it, atomically.
-- The rule is budget/policy.py's `decide`, line for line; the counter names are
-- budget/ledger.py's (the contract suite holds both backends to the same answers).
-- KEYS[1] {<prefix>:budget}:w:<window start s>        HASH counters, and name:<job> -> "<class>\t<name>"
-- KEYS[2] {<prefix>:budget}:w:<window start s>:runs   SET  "<counter>\t<run id>": runs counted once
-- KEYS[3] {<prefix>:budget}:w:<window start s>:log    STREAM one entry per call, in admission order
-- ARGV[1] call class      ARGV[2] counted (1: the model counts)   ARGV[3] enforce (1/0)
-- ARGV[4] background cap  ARGV[5] job cap ('' = none)             ARGV[6] job id ('' = none)
-- ARGV[7] job name        ARGV[8] run id                          ARGV[9] profile
-- ARGV[10] provider       ARGV[11] model                          ARGV[12] api mode
-- ARGV[13] window start s ARGV[14] expire at (epoch s)            ARGV[15] log entries kept
-- Returns {decision, counted 1/0, window total after, job requests after, job held runs after}.
local call_class, job_id, profile = ARGV[1], ARGV[6], ARGV[9]
local model_counts, enforce = ARGV[2] == '1', ARGV[3] == '1'
local background_cap = tonumber(ARGV[4])
local job_cap = tonumber(ARGV[5])  -- nil when ''

local job_key, held_runs_key = '', ''
if job_id ~= '' then
  job_key = 'job:' .. job_id .. ':requests'
  held_runs_key = 'job:' .. job_id .. ':held_runs'
end
local have = redis.call('HMGET', KEYS[1], 'total', job_key, held_runs_key)
local total = tonumber(have[1]) or 0
local job_requests = tonumber(have[2]) or 0
local held_runs = tonumber(have[3]) or 0

local decision = D_ALLOWED
if (call_class == C_CRON or call_class == C_BULK) and model_counts then
  local over = total >= background_cap or (job_cap ~= nil and job_requests >= job_cap)
  if over then
    if enforce then decision = D_HELD else decision = D_WOULD_BLOCK end
  end
end
local counted = model_counts and (decision == D_ALLOWED or decision == D_WOULD_BLOCK)

redis.call('HINCRBY', KEYS[1], 'calls', 1)
redis.call('HINCRBY', KEYS[1], 'decision:' .. decision, 1)
if counted then
  total = total + 1
  redis.call('HINCRBY', KEYS[1], 'total', 1)
  redis.call('HINCRBY', KEYS[1], 'class:' .. call_class, 1)
  redis.call('HINCRBY', KEYS[1], 'profile:' .. (profile ~= '' and profile or 'default'), 1)
  if job_id ~= '' then
    job_requests = job_requests + 1
    redis.call('HINCRBY', KEYS[1], job_key, 1)
  end
elseif decision ~= D_HELD then
  redis.call('HINCRBY', KEYS[1], 'uncounted', 1)
end
if decision == D_HELD and job_id ~= '' then
  redis.call('HINCRBY', KEYS[1], 'job:' .. job_id .. ':held', 1)
end
if job_id ~= '' and (decision == D_HELD or decision == D_WOULD_BLOCK) then
  local run_key = held_runs_key
  if decision == D_WOULD_BLOCK then run_key = 'job:' .. job_id .. ':would_block_runs' end
  if redis.call('SADD', KEYS[2], run_key .. '\t' .. ARGV[8]) == 1 then
    redis.call('HINCRBY', KEYS[1], run_key, 1)
    if decision == D_HELD then held_runs = held_runs + 1 end
  end
end
if job_id ~= '' then
  local name_field = 'name:' .. job_id
  if ARGV[7] ~= '' or redis.call('HEXISTS', KEYS[1], name_field) == 0 then
    redis.call('HSET', KEYS[1], name_field, call_class .. '\t' .. ARGV[7])
  end
end
local t = redis.call('TIME')
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[15], '*',
  'at', t[1] .. '.' .. string.format('%06d', tonumber(t[2])), 'w', ARGV[13], 'class', call_class,
  'profile', profile, 'job', job_id, 'name', ARGV[7], 'run', ARGV[8], 'provider', ARGV[10],
  'model', ARGV[11], 'api_mode', ARGV[12], 'decision', decision, 'counted', counted and '1' or '0')
-- Nothing outlives its window by more than the keep time (set on every call: cheap, and a
-- key recreated after expiry gets it back).
for i = 1, 3 do redis.call('EXPIREAT', KEYS[i], ARGV[14]) end
return {decision, counted and 1 or 0, total, job_requests, held_runs}
