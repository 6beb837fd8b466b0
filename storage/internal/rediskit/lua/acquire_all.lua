-- Takes several keys at once, all or nothing (one Redis node).
-- KEYS: for each key, its lock key, waiting queue and the queue's expiries
-- (see acquire.lua): 3 names a key.
-- ARGV[1] ttl in milliseconds, ARGV[2] the caller's deadline in Unix
-- milliseconds (server clock) or 0, ARGV[3] the caller's queue member or
-- '', ARGV[4] how long its place stays without a new attempt (ms),
-- ARGV[5..] one token per key.
-- A caller that finds key i held joins key i's waiting queue (keeping its
-- first place) and flags the key, so that a release wakes it in its turn
-- like any waiter; one that takes every key leaves all their queues.
-- Returns {1, fence 1, fence 2, ...} when all were taken, {0, i, PTTL} when
-- key i (1-based) is held, {-1} when the request arrived after the deadline.
local now = clock_ms()
if ARGV[2] ~= '0' and now > tonumber(ARGV[2]) then
  return {-1}
end
local member = ARGV[3]
local n = #KEYS / 3
local last, wflag = {}, {}
for i = 1, n do
  local lk = KEYS[3 * i - 2]
  local v = redis.call('GET', lk)
  local tok, f, flags = lock_parse(v)
  if tok then
    if member ~= '' then
      local life = tonumber(ARGV[4])
      redis.call('ZADD', KEYS[3 * i - 1], 'NX', now, member)
      redis.call('HSET', KEYS[3 * i], member, now + life)
      redis.call('PEXPIRE', KEYS[3 * i - 1], 2 * life)
      redis.call('PEXPIRE', KEYS[3 * i], 2 * life)
      if not has(flags, 'w') and string.sub(v, 1, 3) == 'L1|' then
        redis.call('SET', lk, lock_value(tok, f, flags .. 'w'), 'KEEPTTL')
      end
    end
    return {0, i, redis.call('PTTL', lk)}
  end
  last[i], wflag[i] = f, has(flags, 'w')
end
local out = {1}
for i = 1, n do
  local f = next_fence(last[i])
  local fl = ''
  if wflag[i] then
    if member ~= '' then
      redis.call('ZREM', KEYS[3 * i - 1], member)
      redis.call('HDEL', KEYS[3 * i], member, member .. '|g')
    end
    fl = waiters_flag(KEYS[3 * i - 1])
  end
  redis.call('SET', KEYS[3 * i - 2], lock_value(ARGV[4 + i], f, fl), 'PX', ARGV[1])
  out[#out + 1] = f
end
return out
