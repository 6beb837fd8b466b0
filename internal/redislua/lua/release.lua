-- KEYS[1] lock key, KEYS[2] owner hash (same hash tag)
-- ARGV[1] token, ARGV[2] release channel (same hash tag),
-- ARGV[3] pub/sub mode: "s" sharded, "c" classic, "a" by server version,
--         "n" none
-- Returns 1 when the key was let go, 2 when one of an owner's holds was
-- given back and others remain (the key stays held), 0 when the key was not
-- ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('HGET', KEYS[2], 't') == ARGV[1] then
  if redis.call('HINCRBY', KEYS[2], 'n', -1) > 0 then
    return 2
  end
  redis.call('DEL', KEYS[2])
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
