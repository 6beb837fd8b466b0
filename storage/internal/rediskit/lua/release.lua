-- KEYS[1] lock key, KEYS[2] owner hash, KEYS[3] waiting queue, KEYS[4]
-- its expiries (see acquire.lua; one hash tag).
-- ARGV[1] token,
-- ARGV[2] a fence the key's tombstone keeps at least (Redlock: the lease's
-- fence, the highest of its nodes'), or '0'.
-- ARGV[3] a reading of this server's clock (µs) taken when the caller's
-- fence was issued, or '0': a fence at or below it is behind the clock, so
-- the common case deletes the key without reading the clock again.
-- (ARGV[1..3] are release_new.lua's: the two scripts share their fast
-- path, release_fast.lua.)
-- ARGV[4] release channel (same hash tag),
-- ARGV[5] pub/sub mode: "s" sharded, "c" classic, "a" by server version,
--         "n" none (a quiet release: nobody is woken),
-- ARGV[6] how long, in milliseconds, the member woken keeps its place
-- unless it tries again (which a waiting process does at once, and which
-- renews the place): a process that died while queued is then woken once
-- and skipped by later releases, not for its place's whole life,
-- ARGV[7] '1': grant the key to the first live member if it asked for
-- grants (acquire.lua recorded its token and TTL): the key is set to its
-- token with a new fence, it leaves the queue, and "g|<token>|<fence>" is
-- announced on its channel, so that it holds the key without another round
-- trip. A member is live when its place has not expired and someone
-- receives on its channel (a process that died has no subscription left):
-- a grant nobody receives is not made, and the member is dropped.
-- The key becomes a tombstone with its last fence (fence.lua). Only when
-- a process joined the queue (flag 'w') is the queue read: the release is
-- announced on the first live member's own channel ("<channel>:<member>"),
-- so one waiting process is woken, not all of them; expired members are
-- dropped. When no member is woken (an empty queue, or Redis before 7.0,
-- where scripts cannot tell their server's version) the general channel
-- is announced on instead.
-- Returns 1 when the key was let go, 2 when one of an owner's holds was
-- given back and others remain (the key stays held), 0 when the key was not
-- ours.
local tok, f, flags = lock_parse(fast_v) -- read by release_fast.lua
if tok ~= ARGV[1] then
  return 0
end
if has(flags, 'o') and redis.call('HGET', KEYS[2], 't') == ARGV[1] then
  if redis.call('HINCRBY', KEYS[2], 'n', -1) > 0 then
    return 2
  end
  redis.call('DEL', KEYS[2])
end
f = math.max(f, tonumber(ARGV[2]))
local pub = publisher(ARGV[5])
if not has(flags, 'w') then
  tombstone(KEYS[1], f, '')
  return 1
end
if not pub then
  tombstone(KEYS[1], f, 'w')
  return 1
end
local woken = false
if redis.REDIS_VERSION_NUM then -- 7.0+: effects replication, TIME is allowed
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)
  local now = 0
  if tonumber(ARGV[3]) > 0 then
    -- A lower bound on the clock (ARGV[3]) will do: a member whose place
    -- ran out a moment ago is woken once more, and a grace set from it
    -- ends a moment early.
    now = math.floor(tonumber(ARGV[3]) / 1000)
  elseif #head > 0 then
    now = clock_ms()
  end
  while #head > 0 do
    local m = head[1]
    local exp, g
    if ARGV[7] == '1' and f > 0 then
      local v = redis.call('HMGET', KEYS[4], m, m .. '|g')
      exp, g = tonumber(v[1]), v[2]
    else
      exp = tonumber(redis.call('HGET', KEYS[4], m))
    end
    if exp and exp > now and g then
      local gtok, ttl = string.match(g, '^([^|]+)|(%d+)')
      local nf, last = issue(f)
      if gtok and redis.call(pub, ARGV[4] .. ':' .. m, 'g|' .. gtok .. '|' .. fmt(nf) .. '|' .. fmt(last - nf + 1)) > 0 then
        redis.call('ZREM', KEYS[3], m)
        redis.call('HDEL', KEYS[4], m, m .. '|g')
        redis.call('SET', KEYS[1], lock_value(gtok, last, waiters_flag(KEYS[3])), 'PX', ttl)
        return 1
      end
      -- Nobody receives for it: a dead member, dropped below.
    elseif exp and exp > now then
      redis.call(pub, ARGV[4] .. ':' .. m, ARGV[1])
      local grace = tonumber(ARGV[6])
      if grace > 0 and exp > now + grace then
        redis.call('HSET', KEYS[4], m, now + grace)
      end
      woken = true
      break
    end
    redis.call('ZREM', KEYS[3], m)
    redis.call('HDEL', KEYS[4], m, m .. '|g')
    head = redis.call('ZRANGE', KEYS[3], 0, 0)
  end
end
if not woken then
  redis.call(pub, ARGV[4], ARGV[1])
end
-- The queue still has members when one was woken (it keeps its place);
-- when the loop above found none left, it is empty.
local flag
if woken then
  flag = 'w'
elseif redis.REDIS_VERSION_NUM then
  flag = ''
else
  flag = waiters_flag(KEYS[3])
end
tombstone(KEYS[1], f, flag)
return 1
