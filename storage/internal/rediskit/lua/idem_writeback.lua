-- Redlock fencing of an idempotency claim, second round (as writeback.lua
-- for locks): raise this node's record fence counter to the claim's fence
-- T, and report whether the claim's token still holds the record here.
-- KEYS[1] record, KEYS[2] fence counter (same hash tag)
-- ARGV[1] token, ARGV[2] T, ARGV[3] the claim's lease in ms
-- Returns 1 when the record is our in-flight claim here (its f is set to
-- T), 0 when not.
raise_fence(KEYS[2], ARGV[2], ARGV[3])
if not our_claim(KEYS[1], ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'f', ARGV[2])
return 1
