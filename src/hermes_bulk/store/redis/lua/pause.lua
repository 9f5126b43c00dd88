-- pause: a 429. Start or extend (never shorten) the shared wait of a provider key. A 429 to a
-- request granted at the key's current epoch (after its last decrease) also halves the request
-- rate the key was seeing (adaptive pacing), which relaxes again from the end of the wait, and
-- doubles the next wait without Retry-After; 429s to requests sent before the last decrease
-- neither slow the rate nor double the wait (store/limits_math.py has the rules).
-- KEYS[1] {<prefix>:limit:<key>} (HASH, as acquire.lua)
-- ARGV[1] wait_ms ('' = none given: base_ms * 2^step, capped, and the step grows; see below)
-- ARGV[2] base_ms   ARGV[3] cap_ms
-- ARGV[4] decrease factor   ARGV[5] longest adaptive interval, ms
-- ARGV[6] recovery doubling period, ms   ARGV[7] shortest adaptive interval, ms
-- ARGV[8] the epoch acquire.lua gave the request
-- Returns the end of the wait (ms since the epoch) as a string.
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'pause_until_ms', 'backoff_step', 'auto_interval_ms',
  'window_start_ms', 'window_count', 'previous_count', 'auto_since_ms', 'decreases')
local pause_until, step = tonumber(h[1]) or 0, tonumber(h[2]) or 0
local auto_interval = tonumber(h[3]) or 0
if auto_interval > 0 then  -- the learned interval as it has relaxed by now
  auto_interval = auto_interval * 2 ^ (-math.max(0, now - (tonumber(h[7]) or 0)) / tonumber(ARGV[6]))
  if auto_interval < tonumber(ARGV[7]) then auto_interval = 0 end
end
local decreases = tonumber(h[8]) or 0
local decrease = tonumber(ARGV[8]) == decreases
if decrease then
  local rate  -- requests per ms
  if auto_interval > 0 then
    rate = 1 / auto_interval
  else
    local elapsed = now - (tonumber(h[4]) or 0)
    local count, previous = tonumber(h[5]) or 0, tonumber(h[6]) or 0
    local per_s
    if elapsed >= 1000 then per_s = count / (elapsed / 1000)  -- a slow request: its own rate, not 0
    else per_s = previous * (1 - elapsed / 1000) + count end
    rate = per_s / 1000
  end
  local longest = tonumber(ARGV[5])
  auto_interval = math.min(longest, 1 / math.max(rate * tonumber(ARGV[4]), 1 / longest))
  redis.call('HSET', KEYS[1], 'auto_interval_ms', fmt_ms(auto_interval), 'decreases', decreases + 1)
end
local wait_ms = tonumber(ARGV[1])
if not wait_ms then
  -- One doubling per generation: a 429 to a request sent before the first 429 of its burst
  -- gets the wait that one chose (limits_math.backoff_wait).
  local exponent = decrease and step or math.max(0, step - 1)
  wait_ms = math.min(tonumber(ARGV[3]), tonumber(ARGV[2]) * 2 ^ exponent)
  if decrease then step = step + 1 end
end
pause_until = math.max(pause_until, now + wait_ms)
redis.call('HSET', KEYS[1], 'pause_until_ms', fmt_ms(pause_until), 'backoff_step', step)
if decrease then redis.call('HSET', KEYS[1], 'auto_since_ms', fmt_ms(pause_until)) end
local h2 = redis.call('HMGET', KEYS[1], 'request_tat_ms', 'token_tat_ms')
local busy_until = math.max(pause_until, tonumber(h2[1]) or 0, tonumber(h2[2]) or 0)
redis.call('PEXPIRE', KEYS[1], math.ceil(busy_until - now) + LIMIT_IDLE_KEEP_MS)
return fmt_ms(pause_until)
