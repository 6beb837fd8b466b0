-- Frees a lock whoever holds it (an operator's forced release) and
-- announces it on the general release channel, which every waiting
-- process listens to.
-- KEYS[1] lock key, KEYS[2] owner hash (one hash tag)
-- ARGV[1] release channel, ARGV[2] pub/sub mode ('s', 'c', 'a', 'n')
-- Returns the token that held the key, or '' when it was free.
local tok = redis.call('GET', KEYS[1])
if not tok then
  return ''
end
redis.call('DEL', KEYS[1], KEYS[2])
local mode = ARGV[2]
if mode == 'a' then
  local v = redis.REDIS_VERSION_NUM
  if v and v >= 0x070000 then mode = 's' else mode = 'c' end
end
if mode == 's' then
  redis.call('SPUBLISH', ARGV[1], tok)
elseif mode == 'c' then
  redis.call('PUBLISH', ARGV[1], tok)
end
return tok
