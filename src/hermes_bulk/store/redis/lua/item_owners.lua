-- item_owners: who holds running items of this job, and how many each; counted here, so a
-- reader gets one pair per owner, not one field per item (a provider batch holds 50,000).
-- KEYS: the job's keys (_job.lua); reads OWNERS only.
-- Returns { owner, n, owner, n, ... }.
local counts, order = {}, {}
for _, owner in ipairs(redis.call('HVALS', OWNERS)) do
  if counts[owner] == nil then
    counts[owner] = 0
    order[#order + 1] = owner
  end
  counts[owner] = counts[owner] + 1
end
local out = {}
for _, owner in ipairs(order) do
  out[#out + 1] = owner
  out[#out + 1] = counts[owner]
end
return out
