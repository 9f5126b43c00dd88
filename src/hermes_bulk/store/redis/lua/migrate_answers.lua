-- migrate_answers: one page of the answer index (P:answers) from layout 1's hex answer keys to
-- their 16 bytes (codec.answer_field; layout.py). A key already stored as bytes is kept (an
-- answer given since); HSCAN returns every field present for the whole scan, so the page
-- cursor may be followed while fields move.
-- KEYS[1] P:answers   ARGV[1] cursor ('0' at the start)
-- Returns the next cursor ('0' when done).
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', 1000)
for i = 1, #page[2], 2 do
  local key = page[2][i]
  if #key == 32 and not string.find(key, '[^0-9a-f]') then
    local bytes = string.gsub(key, '..', function(cc) return string.char(tonumber(cc, 16)) end)
    redis.call('HSETNX', KEYS[1], bytes, page[2][i + 1])
    redis.call('HDEL', KEYS[1], key)
  end
end
return page[1]
