-- delete_job: remove every key of a job (UNLINK frees large hashes off the main thread).
-- KEYS: the job's keys (_job.lua); deletes its twelve, and its entries of the answer index.
-- ARGV[1] the job id
-- Returns 1 if the job existed, else 0.
local existed = redis.call('EXISTS', META)
local prefix = ARGV[1] .. '\t'
local cursor = '0'
repeat
  local page = redis.call('HSCAN', AKEYS, cursor, 'MATCH', 'i:*', 'COUNT', 1000)
  cursor = page[1]
  for i = 2, #page[2], 2 do
    local key = page[2][i]
    local owner = redis.call('HGET', ANSWERS, key)
    if owner and string.sub(owner, 1, #prefix) == prefix then redis.call('HDEL', ANSWERS, key) end
  end
until cursor == '0'
redis.call('UNLINK', unpack(KEYS, 1, 12))
return existed
