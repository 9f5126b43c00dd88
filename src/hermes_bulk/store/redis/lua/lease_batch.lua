-- lease_batch: lease an open batch to a worker if its lease is free, expired, the worker's, or
-- held by ARGV[4] (a worker the caller found dead; '' = none).
-- KEYS[1] the job's batches hash.   ARGV[1] batch_id   ARGV[2] worker_id   ARGV[3] lease_ms
-- ARGV[4] take_from
-- Returns the batch record JSON, or false.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local b = cjson.decode(raw)
local now = now_ms() / 1000
if b.status == 'done' then return false end
if b.lease_owner and b.lease_owner ~= ARGV[2] and b.lease_owner ~= ARGV[4] and b.lease_until >= now then
  return false
end
b.lease_owner, b.lease_until = ARGV[2], now + tonumber(ARGV[3]) / 1000
local enc = cjson.encode(b)
redis.call('HSET', KEYS[1], ARGV[1], enc)
return enc
