-- _clock.lua: prepended to every script (after the generated constants).
-- The clock is Redis TIME, so workers on machines with skewed clocks agree on leases,
-- pauses and pacing. Times are float milliseconds since the epoch (microsecond fraction).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

-- Lua's tostring and cjson keep 14 significant digits and replies truncate numbers to
-- integers, so times leave a script as strings with an explicit format.
local function fmt_ms(ms)
  return string.format('%.3f', ms)
end
