-- migrate_layout: move items ARGV[1]..ARGV[2] of a job of layout 1 into the buckets (layout.py).
-- Layout 1 kept one hash per family for the whole job: ITEMS ("<estimate>\t<content_hash>\t<JSON
-- [name, origin, offset, stat_sig]>"), STATES (JSON, status, provider and model spelled out),
-- RESULTS, AKEYS' "i:<index>" entries, and hashes in hex (content hashes as CONTENTS fields,
-- answer keys in AKEYS). Each item moves whole in this script (written as add_items and
-- save_state write it, then taken from the old hashes), so a migration stopped anywhere is
-- finished by running it again; a completed item keeps no source.
-- KEYS: the job's keys and the buckets of the items it moves (_job.lua).
-- ARGV[1] first index   ARGV[2] last index
-- Returns the number of items moved.
-- An item's state fields (st.s, st.a, st.r, ...): their legend is store/redis/item_state.py.
local function unhex(hex)
  return (string.gsub(hex, '..', function(cc) return string.char(tonumber(cc, 16)) end))
end
local function is_hex32(s)
  return #s == 32 and not string.find(s, '[^0-9a-f]')
end
-- codec.content_field and codec.answer_field, for the values layout 1 wrote.
local function content_field(content_hash)
  local hex = string.match(content_hash, '^b2:(.*)$')
  if hex and is_hex32(hex) then return '\0' .. unhex(hex) end
  return content_hash
end
local function answer_field(key)
  if is_hex32(key) then return unhex(key) end
  return key
end

redis.call('HSETNX', META, 'added', redis.call('HLEN', ITEMS))  -- before any item moves
local moved = 0
for idx = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  local raw = redis.call('HGET', ITEMS, idx)
  if raw then
    local estimate, content_hash, rest = string.match(raw, '^(%-?%d+)\t([^\t]*)\t(.*)$')
    local record = cjson.decode(rest)
    local field = content_field(content_hash)
    redis.call('HSET', at('items', idx), idx, estimate .. '\t' .. field)
    redis.call('HSET', at('names', idx), idx, record[1])
    local content = redis.call('HGET', CONTENTS, content_hash)
    if content and field ~= content_hash then
      redis.call('HSET', CONTENTS, field, content)
      redis.call('HDEL', CONTENTS, content_hash)
    end
    local raw_state = redis.call('HGET', STATES, idx)
    local st = raw_state and cjson.decode(raw_state)
    if not (st and st.s == S_COMPLETED) then
      redis.call('HSET', at('sources', idx), idx, cjson.encode({record[2], record[3], record[4]}))
    end
    if st then save_state(idx, st) end
    local result = redis.call('HGET', RESULTS, idx)
    if result then redis.call('HSET', at('results', idx), idx, result) end
    local key = redis.call('HGET', AKEYS, 'i:' .. idx)
    if key then
      redis.call('HSET', at('keys', idx), idx, answer_field(key))
      local first = redis.call('HGET', AKEYS, 'k:' .. key)
      if first then
        redis.call('HSET', AKEYS, 'k:' .. answer_field(key), first)
        if answer_field(key) ~= key then redis.call('HDEL', AKEYS, 'k:' .. key) end
      end
    end
    redis.call('HDEL', STATES, idx)
    redis.call('HDEL', RESULTS, idx)
    redis.call('HDEL', AKEYS, 'i:' .. idx)
    redis.call('HDEL', ITEMS, idx)
    moved = moved + 1
  end
end
return moved
