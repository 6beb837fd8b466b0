-- KEYS[1] lock key, KEYS[2] owner hash (same hash tag)
-- ARGV[1] token, ARGV[2] ttl in milliseconds
-- Returns 1 when our lease was extended, 0 when the key was not ours.
-- An owner with several holds shares one key: a refresh of one hold never
-- shortens the key's expiry below what another hold was promised.
local tok, f, flags = lock_parse(redis.call('GET', KEYS[1]))
if tok ~= ARGV[1] then
  return 0
end
local ttl = tonumber(ARGV[2])
if has(flags, 'o') then
  local own = redis.call('HMGET', KEYS[2], 't', 'n')
  if own[1] == ARGV[1] then
    if tonumber(own[2] or '1') > 1 then
      ttl = math.max(ttl, redis.call('PTTL', KEYS[1]))
    end
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
