-- add_items: append one batch of items to a job (contents stored once per hash).
-- KEYS: the job's keys (_job.lua); writes META, ITEMS, CONTENTS, PENDING.
-- ARGV: ten per item: index, record ("<estimate>\t<content_hash>\t<JSON [name, origin,
--       offset, stat_sig]>"), content_hash, content, estimate, answer key ('' = none), and
--       the answer reused ('' job id = none, else job id, index, tokens, result text).
-- An item with an answer is added completed; one whose answer key an earlier item of the job
-- has waits on it (DUPS); the first of each key is pending and recorded in AKEYS.
-- Returns the number added, or an error (unknown job, index already present; nothing written).
if redis.call('EXISTS', META) == 0 then
  return redis.error_reply('ERR no such job')
end
for i = 1, #ARGV, 10 do
  if redis.call('HEXISTS', ITEMS, ARGV[i]) == 1 then
    return redis.error_reply('ERR item index ' .. ARGV[i] .. ' already added')
  end
end
local estimated, max_index = 0, tonumber(redis.call('HGET', META, 'max_index'))
local reused, saved = 0, 0
for i = 1, #ARGV, 10 do
  local idx = tonumber(ARGV[i])
  local key, from_job = ARGV[i + 5], ARGV[i + 6]
  redis.call('HSET', ITEMS, ARGV[i], ARGV[i + 1])
  redis.call('HSETNX', CONTENTS, ARGV[i + 2], ARGV[i + 3])
  if from_job ~= '' then
    local tokens = tonumber(ARGV[i + 8])
    save_state(ARGV[i], {s = S_COMPLETED, a = 0, w = 0, r = 0, rj = from_job, ri = tonumber(ARGV[i + 7]), ts = tokens})
    redis.call('HSET', RESULTS, ARGV[i], ARGV[i + 9])
    reused, saved = reused + 1, saved + tokens
  else
    local first = key ~= '' and redis.call('HGET', AKEYS, 'k:' .. key)
    if first then
      save_state(ARGV[i], {s = S_WAITING, a = 0, w = 0, r = 0, d = tonumber(first)})
      redis.call('ZADD', DUPS, first, ARGV[i])
    else
      if key ~= '' then redis.call('HSET', AKEYS, 'k:' .. key, ARGV[i], 'i:' .. ARGV[i], key) end
      redis.call('ZADD', PENDING, idx, ARGV[i])
    end
  end
  estimated = estimated + tonumber(ARGV[i + 4])
  if idx > max_index then max_index = idx end
end
redis.call('HINCRBY', META, 'estimated_tokens', estimated)
redis.call('HSET', META, 'max_index', max_index)
if reused > 0 then
  redis.call('HINCRBY', META, 'reused', reused)
  redis.call('HINCRBY', META, 'tokens_saved', saved)
end
return #ARGV / 10
