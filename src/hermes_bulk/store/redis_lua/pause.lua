-- pause: start or extend (never shorten) the shared wait of a provider key.
-- KEYS[1] {<prefix>:limit:<key>} (HASH, as acquire.lua)
-- ARGV[1] wait_ms ('' = none given: base_ms * 2^step, capped, and the step grows)
-- ARGV[2] base_ms   ARGV[3] cap_ms
-- Returns the end of the wait (ms since the epoch) as a string.
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'pause_until_ms', 'backoff_step')
local pause_until, step = tonumber(h[1]) or 0, tonumber(h[2]) or 0
local wait_ms = tonumber(ARGV[1])
if not wait_ms then
  wait_ms = math.min(tonumber(ARGV[3]), tonumber(ARGV[2]) * 2 ^ step)
  step = step + 1
end
pause_until = math.max(pause_until, now + wait_ms)
redis.call('HSET', KEYS[1], 'pause_until_ms', fmt_ms(pause_until), 'backoff_step', step)
local h2 = redis.call('HMGET', KEYS[1], 'request_tat_ms', 'token_tat_ms')
local busy_until = math.max(pause_until, tonumber(h2[1]) or 0, tonumber(h2[2]) or 0)
redis.call('PEXPIRE', KEYS[1], math.ceil(busy_until - now) + LIMIT_IDLE_KEEP_MS)
return fmt_ms(pause_until)
