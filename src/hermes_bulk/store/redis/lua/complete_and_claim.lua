-- complete_and_claim: complete_item, then, when it completed, claim_item for the same worker,
-- in one script (a worker thread's steady state: one round trip per item).
-- KEYS: the job's keys (_job.lua). scripts.py puts complete_item.lua and claim_item.lua
-- ahead of this as the functions complete_item(ARGV) and claim_item(ARGV), each given its own
-- ARGV: ARGV[1..12] complete_item's, ARGV[13..16] claim_item's; ARGV[17] '1' to take the
-- next request's turn of the provider key KEYS[14] (unpaced: no rpm, no tpm) for the item
-- claimed, with ARGV[18..19] acquire's ARGV[4..5] (acquire.lua, put ahead as acquire(KEYS, ARGV)):
-- a worker's steady state is then one round trip an item, not two.
-- Returns {0} when the completion was refused (nothing changed), else {1, claim_item's reply},
-- and acquire's reply third when a turn was asked for and an item was claimed.
-- Both halves' items are checked first: the claim's check must not end the script after the
-- completion has written (the completion leaves PENDING as it is, so the claim's item is known).
local idxs = with_duplicates(ARGV[1])
local candidate = claim_candidate(ARGV[13])
if candidate then idxs[#idxs + 1] = candidate end
need_buckets(idxs)
if complete_item({unpack(ARGV, 1, 12)}) == 0 then return {0} end
local claimed = claim_item({unpack(ARGV, 13, 16)})
if ARGV[17] == '1' and claimed[1] == 'ok' then
  return {1, claimed, acquire({KEYS[14]}, {0, 0, 0, ARGV[18], ARGV[19]})}
end
return {1, claimed}
