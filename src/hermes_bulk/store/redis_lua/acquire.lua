-- acquire: take one request (and `tokens` tokens) for a provider key if it is not paused
-- and pacing allows; a generic cell rate algorithm with a burst of one unit, so requests
-- (and tokens) are spaced evenly at the rate. A cost above one unit goes through when the
-- bucket is empty, so one large item can never block forever.
-- KEYS[1] {<prefix>:limit:<key>} (HASH request_tat_ms, token_tat_ms, pause_until_ms,
--         backoff_step)
-- ARGV[1] requests per minute (0 = unpaced)   ARGV[2] tokens per minute (0 = unpaced)
-- ARGV[3] tokens
-- Returns the wait in ms as a string: '0.000' when taken, else how long to wait before
-- asking again (nothing taken).
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'request_tat_ms', 'token_tat_ms', 'pause_until_ms')
local request_tat, token_tat = tonumber(h[1]) or 0, tonumber(h[2]) or 0
local pause_until = tonumber(h[3]) or 0
if pause_until > now then return fmt_ms(pause_until - now) end

-- (new theoretical arrival time, wait) for one pacing dimension.
local function gcra(tat, per_minute, cost)
  if per_minute <= 0 or cost <= 0 then return tat, 0 end
  if tat > now then return tat, tat - now end
  return now + (60000 / per_minute) * cost, 0
end

local new_request_tat, wait_request = gcra(request_tat, tonumber(ARGV[1]), 1)
local new_token_tat, wait_token = gcra(token_tat, tonumber(ARGV[2]), tonumber(ARGV[3]))
local wait = math.max(wait_request, wait_token)
if wait > 0 then return fmt_ms(wait) end
redis.call('HSET', KEYS[1], 'request_tat_ms', fmt_ms(new_request_tat),
  'token_tat_ms', fmt_ms(new_token_tat))
local busy_until = math.max(new_request_tat, new_token_tat, pause_until)
redis.call('PEXPIRE', KEYS[1], math.ceil(busy_until - now) + LIMIT_IDLE_KEEP_MS)
return fmt_ms(0)
