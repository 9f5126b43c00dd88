-- add_items: append one batch of items to a job (contents stored once per hash).
-- KEYS: the job's keys (_job.lua); writes META, ITEMS, CONTENTS, PENDING.
-- ARGV: five per item: index, record ("<estimate>\t<content_hash>\t<JSON [name, origin,
--       offset, stat_sig]>"), content_hash, content, estimate.
-- Returns the number added, or an error (unknown job, index already present; nothing written).
if redis.call('EXISTS', META) == 0 then
  return redis.error_reply('ERR no such job')
end
for i = 1, #ARGV, 5 do
  if redis.call('HEXISTS', ITEMS, ARGV[i]) == 1 then
    return redis.error_reply('ERR item index ' .. ARGV[i] .. ' already added')
  end
end
local estimated, max_index = 0, tonumber(redis.call('HGET', META, 'max_index'))
for i = 1, #ARGV, 5 do
  local idx = tonumber(ARGV[i])
  redis.call('HSET', ITEMS, ARGV[i], ARGV[i + 1])
  redis.call('HSETNX', CONTENTS, ARGV[i + 2], ARGV[i + 3])
  redis.call('ZADD', PENDING, idx, ARGV[i])
  estimated = estimated + tonumber(ARGV[i + 4])
  if idx > max_index then max_index = idx end
end
redis.call('HINCRBY', META, 'estimated_tokens', estimated)
redis.call('HSET', META, 'max_index', max_index)
return #ARGV / 5
