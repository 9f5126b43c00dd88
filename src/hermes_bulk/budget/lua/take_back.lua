-- take_back: a counted call never reached the provider; its counts go back, atomically.
-- The counters are budget/ledger.py's (counters_taken_back), never taken below 0; the contract
-- suite holds this and the SQLite ledger to the same answers.
-- KEYS[1] {<prefix>:budget}:w:<window start s>        HASH counters
-- KEYS[2] {<prefix>:budget}:w:<window start s>:log    STREAM one entry per call
-- ARGV[1] window start s  ARGV[2] expire at (epoch s)  ARGV[3] log entries kept
-- ARGV[4] call class      ARGV[5] profile   ARGV[6] job id   ARGV[7] job name   ARGV[8] run id
-- ARGV[9] provider        ARGV[10] model    ARGV[11] api mode
-- ARGV[12..] the counters to take back
for i = 12, #ARGV do
  if (tonumber(redis.call('HGET', KEYS[1], ARGV[i])) or 0) > 0 then
    redis.call('HINCRBY', KEYS[1], ARGV[i], -1)
  end
end
redis.call('HINCRBY', KEYS[1], D_NOT_SENT, 1)
local t = redis.call('TIME')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*',
  'at', t[1] .. '.' .. string.format('%06d', tonumber(t[2])), 'w', ARGV[1], 'class', ARGV[4],
  'profile', ARGV[5], 'job', ARGV[6], 'name', ARGV[7], 'run', ARGV[8], 'provider', ARGV[9],
  'model', ARGV[10], 'api_mode', ARGV[11], 'decision', D_NOT_SENT, 'counted', '0')
for i = 1, 2 do redis.call('EXPIREAT', KEYS[i], ARGV[2]) end
return 1
