-- delete_job: remove every key of a job (UNLINK frees large hashes off the main thread).
-- KEYS: the job's keys and every bucket of its per-item records (0 .. max_index / BUCKET_ITEMS)
--       (_job.lua); deletes them all, and its entries of the answer index.
-- ARGV[1] the job id
-- Returns 1 if the job existed, else 0.
local existed = redis.call('EXISTS', META)
local prefix = ARGV[1] .. '\t'
local top = tonumber(redis.call('HGET', META, 'max_index') or '-1')
for b = 0, math.floor(top / BUCKET_ITEMS) do
  local first = b * BUCKET_ITEMS
  local keys = redis.call('HVALS', at('keys', first))
  for _, key in ipairs(keys) do
    local owner = redis.call('HGET', ANSWERS, key)
    if owner and string.sub(owner, 1, #prefix) == prefix then redis.call('HDEL', ANSWERS, key) end
  end
  redis.call('UNLINK', at('items', first), at('names', first), at('sources', first), at('states', first),
    at('results', first), at('keys', first))
end
redis.call('UNLINK', unpack(KEYS, 1, 12))
return existed
