-- KEYS[1] lock key, KEYS[2] fence counter (same hash tag)
-- ARGV[1] token, ARGV[2] ttl in milliseconds,
-- ARGV[3] the caller's deadline in Unix milliseconds, or 0 for none,
-- ARGV[4] "0" to skip the fence counter (Redlock's unfenced mode; fence 0)
-- Returns {1, fence} when taken, {0, holder's PTTL in ms} when held,
-- {1, current counter} with the expiry renewed when ARGV[1] already holds
-- the key (Redlock keeps the nodes it took while it settles a split vote),
-- {-1, 0} when the request arrived after the caller's deadline (it was
-- delayed, by a paused server or a slow network, and the caller is gone).
if ARGV[3] ~= '0' then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[3]) then
    return {-1, 0}
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[4] == '0' then return {1, 0} end
  return {1, redis.call('INCR', KEYS[2])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, redis.call('PTTL', KEYS[1])}
