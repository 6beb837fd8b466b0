-- KEYS[1] lock key, KEYS[2] owner hash (same hash tag)
-- ARGV[1] token, ARGV[2] ttl in milliseconds
-- Returns 1 when our lease was extended, 0 when the key was not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('HGET', KEYS[2], 't') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
