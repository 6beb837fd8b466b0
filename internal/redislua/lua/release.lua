-- KEYS[1] lock key
-- ARGV[1] token, ARGV[2] release channel (same hash tag),
-- ARGV[3] pub/sub mode: "s" sharded, "c" classic, "a" by server version
-- Returns 1 when our lease was deleted, 0 when the key was not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local mode = ARGV[3]
if mode == 'a' then
  local v = redis.REDIS_VERSION_NUM
  if v and v >= 0x070000 then mode = 's' else mode = 'c' end
end
if mode == 's' then
  redis.call('SPUBLISH', ARGV[2], ARGV[1])
elseif mode == 'c' then
  redis.call('PUBLISH', ARGV[2], ARGV[1])
end
return 1
