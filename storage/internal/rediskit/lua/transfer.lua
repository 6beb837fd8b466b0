-- Hands a held lock from one lease of this process to the next local
-- waiter without letting go of the key: one round trip instead of a
-- release and an acquire.
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] owner hash (one hash tag)
-- ARGV[1] current token, ARGV[2] next token, ARGV[3] ttl in milliseconds,
-- ARGV[4] the next waiter's owner, or "", optional ARGV[5] the fences
-- reserved past the new one (see fence.lua)
-- Returns {1, fence} when handed off; {2, 0} when the current token is an
-- owner's with other holds left (one hold given back, nothing handed
-- over); {0, 0} when the current token no longer holds the key.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0}
end
if redis.call('HGET', KEYS[3], 't') == ARGV[1] then
  if redis.call('HINCRBY', KEYS[3], 'n', -1) > 0 then
    return {2, 0}
  end
  redis.call('DEL', KEYS[3])
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
local f = next_fence(KEYS[2], ARGV[3], ARGV[5])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[3], 'o', ARGV[4], 't', ARGV[2], 'n', 1, 'f', string.format('%d', f))
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return {1, f}
