-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] owner hash (one hash tag)
-- ARGV[1] token, ARGV[2] ttl in milliseconds,
-- ARGV[3] the caller's deadline in Unix milliseconds, or 0 for none,
-- ARGV[4] "0" to skip the fence counter (Redlock's unfenced mode; fence 0),
-- ARGV[5] owner identity for reentrancy, or "" for none,
-- optional: KEYS[4] waiting queue (sorted set), KEYS[5] queue expiries
-- (hash), ARGV[6] the caller's queue member (its process), ARGV[7] how long
-- its place stays without a new attempt, in milliseconds, optional ARGV[8]
-- its place in the queue (default: the server's time in milliseconds;
-- Redlock passes when the caller began waiting, so that every node orders
-- the waiters alike; '0': the default), optional ARGV[9] the wake grace in
-- milliseconds (see release.lua), optional ARGV[10] '1' when the caller
-- accepts the key granted by a release while it waits (see release.lua):
-- its token and TTL are then recorded with its place ("<member>|g" in
-- KEYS[5]), optional ARGV[11] how many fences past the one issued the
-- caller reserves for its local hand-offs (see fence.lua; default 0), also
-- recorded for a grant. A caller that finds the key held joins the queue (keeping its
-- first place); one that takes the key leaves it.
-- Release wakes the first live member, and the key stays reserved for it
-- until it tries again or its grace runs out: any other caller finds the
-- key busy meanwhile (bounded barging), so a process that releases and at
-- once asks again cannot take the key back from the waiter woken for it.
-- Returns
--   {1, fence}             taken (fence: see fence.lua);
--   {1, current counter}   ARGV[1] already holds the key (Redlock keeps the
--                          nodes it took while it settles a split vote):
--                          its expiry is renewed;
--   {2, fence, token}      re-entered: the owner ARGV[5] holds the key, one
--                          more hold is counted, the expiry is at least TTL;
--   {0, holder's PTTL, floor}
--                          held by someone else (or reserved for the
--                          woken first waiter: PTTL is what is left of
--                          its grace); floor is the highest fence issued
--                          or reserved so far (fence.lua): a grant that a
--                          release sends later carries a fence above it,
--                          so the caller can tell a grant made after this
--                          attempt from one made before it (redisstore);
--   {-1, 0}                the request arrived after the caller's deadline
--                          (a paused server, a slow network) and took nothing.
-- The owner hash {o = owner, t = token, n = holds, f = fence} exists only
-- while an owner holds the key, with the key's expiry; it counts only while
-- its t matches the key's token.
local member = ARGV[6] or ''
local function leave()
  if member ~= '' then
    redis.call('ZREM', KEYS[4], member)
    redis.call('HDEL', KEYS[5], member, member .. '|g')
  end
end
if ARGV[3] ~= '0' and clock_ms() > tonumber(ARGV[3]) then
  return {-1, 0}
end
-- reservedFor returns the milliseconds left of a woken first waiter's
-- grace when the key is reserved for another member than the caller.
local function reservedFor()
  local grace = tonumber(ARGV[9] or '0')
  if not KEYS[5] or grace <= 0 then
    return 0
  end
  local head = redis.call('ZRANGE', KEYS[4], 0, 0)
  if #head == 0 or head[1] == member then
    return 0
  end
  local exp = tonumber(redis.call('HGET', KEYS[5], head[1]) or '0')
  local now = clock_ms()
  if exp > now and exp <= now + grace then
    return exp - now
  end
  return 0
end
local reserve = ARGV[11] or '0'
local reserved = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  reserved = reservedFor()
end
if reserved == 0 and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = 0
  if ARGV[4] ~= '0' then f = next_fence(KEYS[2], ARGV[2], reserve) end
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[3], 'o', ARGV[5], 't', ARGV[1], 'n', 1, 'f', string.format('%d', f))
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  leave()
  return {1, f}
end
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if reserve ~= '0' then -- a fresh fence, with its own reservation
    leave()
    return {1, next_fence(KEYS[2], ARGV[2], reserve)}
  end
  return {1, fence_floor(KEYS[2])}
end
if ARGV[5] ~= '' then
  local own = redis.call('HMGET', KEYS[3], 'o', 't', 'f')
  if own[1] == ARGV[5] and own[2] == cur then
    redis.call('HINCRBY', KEYS[3], 'n', 1)
    if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      redis.call('PEXPIRE', KEYS[3], ARGV[2])
    end
    leave()
    return {2, tonumber(own[3]), cur}
  end
end
if member ~= '' then
  local now = clock_ms()
  local life = tonumber(ARGV[7])
  local place = tonumber(ARGV[8] or '0')
  if place == 0 then place = now end
  redis.call('ZADD', KEYS[4], 'NX', place, member)
  redis.call('HSET', KEYS[5], member, now + life)
  if ARGV[10] == '1' and ARGV[5] == '' then
    redis.call('HSET', KEYS[5], member .. '|g', ARGV[1] .. '|' .. ARGV[2] .. '|' .. reserve)
  else
    redis.call('HDEL', KEYS[5], member .. '|g')
  end
  redis.call('PEXPIRE', KEYS[4], 2 * life)
  redis.call('PEXPIRE', KEYS[5], 2 * life)
end
local floor = fence_floor(KEYS[2])
if reserved > 0 then
  return {0, reserved, floor}
end
return {0, redis.call('PTTL', KEYS[1]), floor}
