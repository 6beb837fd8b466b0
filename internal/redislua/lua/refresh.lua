-- KEYS[1] lock key
-- ARGV[1] token, ARGV[2] ttl in milliseconds
-- Returns 1 when our lease was extended, 0 when the key was not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
