-- acquire: take one request (and `tokens` tokens) for a provider key if it is not paused
-- and pacing allows (the rules are store/limits_math.py's, in milliseconds): GCRA with a burst
-- of one unit, requests spaced at the slower of rpm and the adaptive interval learned from
-- 429s (which halves every recovery period after the wait); a cost above one unit goes
-- through when the bucket is empty. A granted request is counted in a one-second window,
-- which is how the adaptive rate is measured.
-- KEYS[1] {<prefix>:limit:<key>} (HASH request_tat_ms, token_tat_ms, pause_until_ms,
--         backoff_step, auto_interval_ms, auto_since_ms, window_start_ms, window_count,
--         previous_count, decreases)
-- ARGV[1] requests per minute (0 = unpaced)   ARGV[2] tokens per minute (0 = unpaced)
-- ARGV[3] tokens   ARGV[4] recovery doubling period, ms   ARGV[5] shortest adaptive interval, ms
-- Returns {wait, clean, epoch}: the wait in ms as a string, '0.000' when taken, else how long
-- to wait before asking again (nothing taken); clean is 1 when the key has no backoff step (a
-- success would change nothing: the caller may skip clear_backoff), else 0; epoch is the key's
-- count of adaptive decreases, which a 429 to this request hands back to pause.lua.
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'request_tat_ms', 'token_tat_ms', 'pause_until_ms',
  'auto_interval_ms', 'auto_since_ms', 'window_start_ms', 'window_count', 'backoff_step', 'decreases')
local request_tat, token_tat = tonumber(h[1]) or 0, tonumber(h[2]) or 0
local pause_until, auto_interval = tonumber(h[3]) or 0, tonumber(h[4]) or 0
local auto_since = tonumber(h[5]) or 0
local window_start, window_count = tonumber(h[6]) or 0, tonumber(h[7]) or 0
local clean = ((tonumber(h[8]) or 0) == 0) and 1 or 0
local epoch = tonumber(h[9]) or 0
if pause_until > now then return {fmt_ms(pause_until - now), clean, epoch} end

-- (new theoretical arrival time, wait) for one pacing dimension.
local function gcra(tat, interval, cost)
  if interval <= 0 or cost <= 0 then return tat, 0 end
  if tat > now then return tat, tat - now end
  return now + interval * cost, 0
end

if auto_interval > 0 then  -- relaxed since the wait ended
  auto_interval = auto_interval * 2 ^ (-math.max(0, now - auto_since) / tonumber(ARGV[4]))
  if auto_interval < tonumber(ARGV[5]) then auto_interval = 0 end
end
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local request_interval = math.max(rpm > 0 and 60000 / rpm or 0, auto_interval)
local new_request_tat, wait_request = gcra(request_tat, request_interval, 1)
local new_token_tat, wait_token = gcra(token_tat, tpm > 0 and 60000 / tpm or 0, tonumber(ARGV[3]))
local wait = math.max(wait_request, wait_token)
if wait > 0 then return {fmt_ms(wait), clean, epoch} end
redis.call('HSET', KEYS[1], 'request_tat_ms', fmt_ms(new_request_tat),
  'token_tat_ms', fmt_ms(new_token_tat))
if now - window_start >= 1000 then
  local previous = (now - window_start < 2000) and window_count or 0
  redis.call('HSET', KEYS[1], 'previous_count', previous, 'window_start_ms', fmt_ms(now), 'window_count', 1)
else
  redis.call('HINCRBY', KEYS[1], 'window_count', 1)
end
local busy_until = math.max(now, new_request_tat, new_token_tat, pause_until)
redis.call('PEXPIRE', KEYS[1], math.ceil(busy_until - now) + LIMIT_IDLE_KEEP_MS)
return {fmt_ms(0), clean, epoch}
