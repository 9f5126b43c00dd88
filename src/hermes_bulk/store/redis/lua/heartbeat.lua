-- heartbeat: register or refresh a live worker; its entry expires ttl after the beat.
-- KEYS[1] {<prefix>:workers} (ZSET worker id -> expires_at_ms)
-- KEYS[2] {<prefix>:workers}:<worker id> (HASH: host, pid, started_at, heartbeat_at_ms,
--         threads, serves; PEXPIREs with the ttl, so a dead worker leaves nothing behind)
-- ARGV[1] worker_id   ARGV[2] host   ARGV[3] pid   ARGV[4] started_at (s)   ARGV[5] threads
-- ARGV[6] ttl_ms   ARGV[7] serves (what it serves: see store/records.py WorkerInfo)
-- Returns 1.
local now = now_ms()
local ttl_ms = math.max(1, math.ceil(tonumber(ARGV[6])))
-- The first beat fixes host, pid and start time, as the SQLite store's upsert does.
redis.call('HSETNX', KEYS[2], 'host', ARGV[2])
redis.call('HSETNX', KEYS[2], 'pid', ARGV[3])
redis.call('HSETNX', KEYS[2], 'started_at', ARGV[4])
redis.call('HSET', KEYS[2], 'heartbeat_at_ms', fmt_ms(now), 'threads', ARGV[5], 'serves', ARGV[7] or '')
redis.call('PEXPIRE', KEYS[2], ttl_ms)
redis.call('ZADD', KEYS[1], now + ttl_ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt_ms(now))
-- The index outlives its longest-lived entry by a moment, and no longer.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(last[2]) - now) + 100)
return 1
