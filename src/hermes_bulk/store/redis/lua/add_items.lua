-- add_items: append one batch of items to a job (contents stored once per hash).
-- KEYS: the job's keys and its items' buckets (_job.lua); writes META, CONTENTS, PENDING, AKEYS,
--       DUPS, and the buckets of items, names, sources, states, results and keys (_job.lua: at).
-- ARGV: thirteen per item: index, head ("<worst case>\t<content_hash>": what its claims
--       reserve), name, source (JSON [origin, offset, stat_sig]), content_hash, content,
--       estimate (expected tokens), answer key ('' = none),
--       and the answer reused ('' job id = none, else job id, index, tokens, cost in nano-USD,
--       result text).
-- An item with an answer is added completed (no source kept: nothing processes it; nor its
-- content where the job drops a completed item's content, as complete_item does: any other
-- item with that content stores it itself, here or in a later batch); one whose answer key an
-- earlier item of the job has waits on it (DUPS); the first of each key is pending and recorded
-- in AKEYS ("k:<key>" -> index) and its keys bucket (index -> key).
-- Returns the number added, or an error (unknown job, index already present; nothing written).
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local N = 13
if redis.call('EXISTS', META) == 0 then
  return redis.error_reply('ERR no such job')
end
for i = 1, #ARGV, N do
  if redis.call('HEXISTS', at('items', ARGV[i]), ARGV[i]) == 1 then
    return redis.error_reply('ERR item index ' .. ARGV[i] .. ' already added')
  end
end
local estimated, worst, max_index = 0, 0, tonumber(redis.call('HGET', META, 'max_index'))
local reused, saved = 0, 0
local drop = redis.call('HGET', META, 'drop_content') == '1'
for i = 1, #ARGV, N do
  local idx = tonumber(ARGV[i])
  local key, from_job = ARGV[i + 7], ARGV[i + 8]
  redis.call('HSET', at('items', idx), idx, ARGV[i + 1])
  redis.call('HSET', at('names', idx), idx, ARGV[i + 2])
  if from_job == '' or not drop then
    redis.call('HSETNX', CONTENTS, ARGV[i + 4], ARGV[i + 5])
  end
  if from_job ~= '' then
    local tokens = tonumber(ARGV[i + 10])
    save_state(idx, {s = S_COMPLETED, rj = from_job, ri = tonumber(ARGV[i + 9]), ts = tokens})
    redis.call('HSET', at('results', idx), idx, ARGV[i + 12])
    reused, saved = reused + 1, saved + tokens
    -- its cost added as the digits it is (a sum of Lua numbers is a double: inexact past 2^53)
    if ARGV[i + 11] ~= '0' then redis.call('HINCRBY', META, 'saved_cost', ARGV[i + 11]) end
  else
    redis.call('HSET', at('sources', idx), idx, ARGV[i + 3])
    local first = key ~= '' and redis.call('HGET', AKEYS, 'k:' .. key)
    if first then
      save_state(idx, {s = S_WAITING, d = tonumber(first)})
      redis.call('ZADD', DUPS, first, idx)
    else  -- only the first of its key is asked: a reused item or a duplicate has no estimate
      estimated = estimated + tonumber(ARGV[i + 6])
      worst = worst + tonumber(string.match(ARGV[i + 1], '^(%-?%d+)'))
      if key ~= '' then
        redis.call('HSET', AKEYS, 'k:' .. key, idx)
        redis.call('HSET', at('keys', idx), idx, key)
      end
      redis.call('ZADD', PENDING, idx, idx)
    end
  end
  if idx > max_index then max_index = idx end
end
redis.call('HINCRBY', META, 'estimated_tokens', estimated)
redis.call('HINCRBY', META, 'worst_tokens', worst)
redis.call('HINCRBY', META, 'added', #ARGV / N)
redis.call('HSET', META, 'max_index', max_index)
if reused > 0 then
  redis.call('HINCRBY', META, 'reused', reused)
  redis.call('HINCRBY', META, 'tokens_saved', saved)
end
return #ARGV / N
