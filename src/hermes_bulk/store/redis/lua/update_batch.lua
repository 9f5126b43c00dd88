-- update_batch: set fields of a batch whose lease the worker holds; done ends the lease, and a
-- job with no open batch left leaves P:jobs:batched.
-- KEYS[1] the job's batches hash   KEYS[2] P:jobs:batched
-- ARGV[1] batch_id   ARGV[2] worker_id   ARGV[3] JSON of the changes   ARGV[4] job id
-- Returns the batch record JSON, or false.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local b = cjson.decode(raw)
if b.lease_owner ~= ARGV[2] then return false end
for k, v in pairs(cjson.decode(ARGV[3])) do
  if v == cjson.null then b[k] = nil else b[k] = v end
end
if b.status == 'done' then b.lease_owner, b.lease_until = nil, 0 end
local enc = cjson.encode(b)
redis.call('HSET', KEYS[1], ARGV[1], enc)
if b.status == 'done' then
  local open = false
  for _, other in ipairs(redis.call('HVALS', KEYS[1])) do
    if cjson.decode(other).status ~= 'done' then open = true break end
  end
  if not open then redis.call('SREM', KEYS[2], ARGV[4]) end
end
return enc
