-- Hands a held lock from one lease of this process to the next local
-- waiter without letting go of the key: one round trip instead of a
-- release and an acquire.
-- KEYS[1] lock key, KEYS[2] fence counter (same hash tag)
-- ARGV[1] current token, ARGV[2] next token, ARGV[3] ttl in milliseconds
-- Returns {1, fence} when handed over, {0, 0} when the current token no
-- longer holds the key.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, 0}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {1, redis.call('INCR', KEYS[2])}
