-- Removes a process from a key's waiting queue (it stopped waiting, or
-- took the key on other nodes).
-- KEYS[1] waiting queue (sorted set), KEYS[2] its expiries (hash)
-- ARGV[1] the process's queue member
-- Returns 1.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1], ARGV[1] .. '|g')
return 1
