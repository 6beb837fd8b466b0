-- Redlock fencing, second round: raise this node's fence counter to the
-- fence T chosen from the acquired majority, only while our token still
-- holds the key here.
-- KEYS[1] lock key, KEYS[2] fence counter (same hash tag)
-- ARGV[1] token, ARGV[2] T
-- Returns 1 when written (or already at least T), 0 when the key is not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
