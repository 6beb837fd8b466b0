-- Takes several keys at once, all or nothing (one Redis node).
-- KEYS: lock key 1, fence counter 1, lock key 2, fence counter 2, ...
-- ARGV[1] ttl in milliseconds, ARGV[2] the caller's deadline in Unix
-- milliseconds or 0, ARGV[3..] one token per key
-- Returns {1, fence 1, fence 2, ...} when all were taken, {0, i, PTTL} when
-- key i (1-based) is held, {-1} when the request arrived after the deadline.
if ARGV[2] ~= '0' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[2]) then
    return {-1}
  end
end
local n = #KEYS / 2
for i = 1, n do
  if redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then
    return {0, i, redis.call('PTTL', KEYS[2 * i - 1])}
  end
end
local out = {1}
for i = 1, n do
  redis.call('SET', KEYS[2 * i - 1], ARGV[2 + i], 'PX', ARGV[1])
  out[#out + 1] = next_fence(KEYS[2 * i], ARGV[1])
end
return out
