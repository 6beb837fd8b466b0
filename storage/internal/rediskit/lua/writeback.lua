-- Redlock fencing, second round: raise this node's fence counter to the
-- fence T chosen from the acquired majority, and report whether our token
-- still holds the key here (only those nodes count towards the majority
-- that grants the lease). Raising the counter on the other nodes too only
-- makes counters larger, never smaller, and lets fences survive the loss
-- of some nodes' data.
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] owner hash (one hash tag)
-- ARGV[1] token, ARGV[2] T, ARGV[3] the lease's TTL in ms (the counter's life),
-- optional ARGV[4] the fences after T the holder keeps for its local
-- hand-offs (see fence.lua)
-- Returns 1 when the key is ours here, 0 when not.
raise_fence(KEYS[2], ARGV[2], ARGV[3], ARGV[4])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('HGET', KEYS[3], 't') == ARGV[1] then
    redis.call('HSET', KEYS[3], 'f', ARGV[2]) -- an owner re-entering gets T
  end
  return 1
end
return 0
