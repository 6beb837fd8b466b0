-- Takes several keys at once, all or nothing (one Redis node).
-- KEYS: for each key, its lock key, fence counter, waiting queue and the
-- queue's expiries (see acquire.lua): 4 names a key.
-- ARGV[1] ttl in milliseconds, ARGV[2] the caller's deadline in Unix
-- milliseconds (server clock) or 0, ARGV[3] the caller's queue member or
-- '', ARGV[4] how long its place stays without a new attempt (ms),
-- ARGV[5..] one token per key.
-- A caller that finds key i held joins key i's waiting queue (keeping its
-- first place), so that a release wakes it in its turn like any waiter;
-- one that takes every key leaves all their queues.
-- Returns {1, fence 1, fence 2, ...} when all were taken, {0, i, PTTL} when
-- key i (1-based) is held, {-1} when the request arrived after the deadline.
local now = clock_ms()
if ARGV[2] ~= '0' and now > tonumber(ARGV[2]) then
  return {-1}
end
local member = ARGV[3]
local n = #KEYS / 4
for i = 1, n do
  local lk = KEYS[4 * i - 3]
  if redis.call('EXISTS', lk) == 1 then
    if member ~= '' then
      local life = tonumber(ARGV[4])
      redis.call('ZADD', KEYS[4 * i - 1], 'NX', now, member)
      redis.call('HSET', KEYS[4 * i], member, now + life)
      redis.call('PEXPIRE', KEYS[4 * i - 1], 2 * life)
      redis.call('PEXPIRE', KEYS[4 * i], 2 * life)
    end
    return {0, i, redis.call('PTTL', lk)}
  end
end
local out = {1}
for i = 1, n do
  redis.call('SET', KEYS[4 * i - 3], ARGV[4 + i], 'PX', ARGV[1])
  out[#out + 1] = next_fence(KEYS[4 * i - 2], ARGV[1])
  if member ~= '' then
    redis.call('ZREM', KEYS[4 * i - 1], member)
    redis.call('HDEL', KEYS[4 * i], member)
  end
end
return out
