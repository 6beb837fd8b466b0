-- KEYS[1] lock key, KEYS[2] owner hash, KEYS[3] waiting queue (sorted
-- set), KEYS[4] the queue members' expiries (hash) (one hash tag)
-- ARGV[1] token, ARGV[2] ttl in milliseconds,
-- ARGV[3] the caller's deadline in Unix milliseconds, or 0 for none,
-- ARGV[4] "0" to issue no fence (Redlock's unfenced mode; fence 0),
-- ARGV[5] owner identity for reentrancy, or "" for none,
-- ARGV[6] the caller's queue member (its process), or "" to stay out of
-- the queue, ARGV[7] how long its place stays without a new attempt, in
-- milliseconds, ARGV[8] its place in the queue ('0': the server's time in
-- milliseconds; Redlock passes when the caller began waiting, so that
-- every node orders the waiters alike), ARGV[9] the wake grace in
-- milliseconds (see release.lua), ARGV[10] '1' when the caller accepts the
-- key granted by a release while it waits (see release.lua): its token
-- and TTL are then recorded with its place ("<member>|g" in KEYS[4]).
-- A caller that finds the key held joins the queue (keeping its first
-- place) and flags the key, so that its release looks at the queue; one
-- that takes the key leaves it. Release wakes the first live member, and
-- the key stays reserved for it until it tries again or its grace runs
-- out: any other caller finds the key busy meanwhile (bounded barging), so
-- a process that releases and at once asks again cannot take the key back
-- from the waiter woken for it.
-- Returns
--   {1, fence, clock, n}   taken (fence: see fence.lua; clock: the
--                          server's clock in µs when the fence was issued,
--                          0 unfenced, for Redlock's check of its nodes;
--                          n: the hold's fences are fence .. fence + n − 1,
--                          0 unfenced);
--   {1, fence, clock, 1}   ARGV[1] already holds the key (Redlock keeps the
--                          nodes it took while it settles a split vote; a
--                          grant whose message was missed): its expiry is
--                          renewed, and the fence is the key's last;
--   {2, fence, token}      re-entered: the owner ARGV[5] holds the key, one
--                          more hold is counted, the expiry is at least TTL;
--   {0, holder's PTTL, floor}
--                          held by someone else (or reserved for the
--                          woken first waiter: PTTL is what is left of its
--                          grace); floor is the key's last fence: a grant
--                          that a release sends later carries a fence
--                          above it, so the caller can tell a grant made
--                          after this attempt from one made before it
--                          (redisstore);
--   {-1, 0}                the request arrived after the caller's deadline
--                          (a paused server, a slow network) and took nothing.
-- The owner hash {o = owner, t = token, n = holds, f = fence} exists only
-- while an owner holds the key (flag 'o'), with the key's expiry; it
-- counts only while its t matches the key's token.
local member = ARGV[6]
local fenced = ARGV[4] ~= '0'
local function leave()
  if member ~= '' then
    redis.call('ZREM', KEYS[3], member)
    redis.call('HDEL', KEYS[4], member, member .. '|g')
  end
end
if ARGV[3] ~= '0' and clock_ms() > tonumber(ARGV[3]) then
  return {-1, 0}
end
local oflag = ''
if ARGV[5] ~= '' then
  oflag = 'o'
end
local function taken(f, last)
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[2], 'o', ARGV[5], 't', ARGV[1], 'n', 1, 'f', fmt(f))
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  leave()
  if fenced then
    return {1, f, clock_us(), last - f + 1}
  end
  return {1, f, 0, 0}
end
-- A key nobody holds or held lately: one call (acquire_fast.lua made it
-- already for a caller with no owner, outside the queue).
local first, first_last = 0, 0
if fenced then
  first, first_last = issue(0)
end
local prev = fast_prev
if not prev then
  prev = set_nx_get(KEYS[1], lock_value(ARGV[1], first_last, oflag), ARGV[2])
  if not prev then
    return taken(first, first_last)
  end
end
local tok, f, flags = lock_parse(prev)
local reserved = 0
if not tok then -- a tombstone: free, with its last fence
  local head
  if has(flags, 'w') then
    -- The first two members: whether the key is reserved for another,
    -- and whether anyone else stays queued once the caller has left.
    head = redis.call('ZRANGE', KEYS[3], 0, 1)
    reserved = reserved_for(KEYS[3], KEYS[4], member, tonumber(ARGV[9]), head)
  end
  if reserved == 0 then
    local nf, last = 0, 0
    if fenced then
      nf, last = issue(f)
    end
    local fl = oflag
    if has(flags, 'w') and head[1] and (head[1] ~= member or head[2]) then
      fl = fl .. 'w' -- others stay queued once the caller left (taken)
    end
    redis.call('SET', KEYS[1], lock_value(ARGV[1], last, fl), 'PX', ARGV[2])
    return taken(nf, last)
  end
elseif tok == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if fenced then
    return {1, f, clock_us(), 1} -- the key's last fence: one lease's worth
  end
  return {1, f, 0, 0}
elseif ARGV[5] ~= '' and has(flags, 'o') then
  local own = redis.call('HMGET', KEYS[2], 'o', 't', 'f')
  if own[1] == ARGV[5] and own[2] == tok then
    redis.call('HINCRBY', KEYS[2], 'n', 1)
    if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      redis.call('PEXPIRE', KEYS[2], ARGV[2])
    end
    leave()
    return {2, tonumber(own[3]), tok}
  end
end
if member ~= '' then
  local now = clock_ms()
  local life = tonumber(ARGV[7])
  local place = tonumber(ARGV[8])
  if place == 0 then place = now end
  local joined = redis.call('ZADD', KEYS[3], 'NX', place, member)
  if ARGV[10] == '1' and ARGV[5] == '' then
    redis.call('HSET', KEYS[4], member, now + life, member .. '|g', ARGV[1] .. '|' .. ARGV[2])
  else
    redis.call('HSET', KEYS[4], member, now + life)
    if joined == 0 then -- a member that just joined has none: every removal drops it
      redis.call('HDEL', KEYS[4], member .. '|g')
    end
  end
  redis.call('PEXPIRE', KEYS[3], 2 * life)
  redis.call('PEXPIRE', KEYS[4], 2 * life)
  if tok and not has(flags, 'w') and string.sub(prev, 1, 3) == 'L1|' then
    redis.call('SET', KEYS[1], lock_value(tok, f, flags .. 'w'), 'KEEPTTL')
  end
end
if reserved > 0 then
  return {0, reserved, f}
end
return {0, redis.call('PTTL', KEYS[1]), f}
