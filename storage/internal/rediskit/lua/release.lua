-- KEYS[1] lock key, KEYS[2] owner hash (same hash tag); optional KEYS[3]
-- waiting queue and KEYS[4] its expiries (see acquire.lua): the release is
-- announced on the first live member's own channel ("<channel>:<member>"),
-- so one waiting process is woken, not all of them; expired members are
-- dropped. When no member is woken (an empty queue, or Redis before 7.0,
-- where scripts cannot tell their server's version) the general channel is
-- announced on instead.
-- ARGV[1] token, ARGV[2] release channel (same hash tag),
-- ARGV[3] pub/sub mode: "s" sharded, "c" classic, "a" by server version,
--         "n" none,
-- optional ARGV[4]: how long, in milliseconds, the member woken keeps its
-- place unless it tries again (which a waiting process does at once, and
-- which renews the place). A process that died while queued is then
-- woken once and skipped by later releases, not for its place's whole
-- life.
-- optional KEYS[5] the key's fence counter and ARGV[5] '1': grant the key
-- to the first live member if it asked for grants (acquire.lua recorded
-- its token, TTL and fence reservation): the key is set to its token with
-- a new fence, it
-- leaves the queue, and "g|<token>|<fence>" is announced on its channel,
-- so that it holds the key without another round trip. A member is live
-- when its place has not expired and someone receives on its channel (a
-- process that died has no subscription left): a grant nobody receives is
-- not made, and the member is dropped.
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
local pub = publisher(ARGV[3])
if pub then
  local woken = false
  if KEYS[4] and redis.REDIS_VERSION_NUM then -- 7.0+: effects replication, TIME is allowed
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)
    if #head > 0 then
      local now = clock_ms()
      while #head > 0 do
        local m = head[1]
        local exp = tonumber(redis.call('HGET', KEYS[4], m))
        local g = nil
        if KEYS[5] and ARGV[5] == '1' then
          g = redis.call('HGET', KEYS[4], m .. '|g')
        end
        if exp and exp > now and g then
          local tok, ttl, reserve = string.match(g, '^([^|]+)|(%d+)|?(%d*)$')
          local f = next_fence(KEYS[5], ttl, reserve)
          if redis.call(pub, ARGV[2] .. ':' .. m, 'g|' .. tok .. '|' .. string.format('%d', f)) > 0 then
            redis.call('SET', KEYS[1], tok, 'PX', ttl)
            redis.call('ZREM', KEYS[3], m)
            redis.call('HDEL', KEYS[4], m, m .. '|g')
            return 1
          end
          -- Nobody receives for it: a dead member, dropped below.
        elseif exp and exp > now then
          redis.call(pub, ARGV[2] .. ':' .. m, ARGV[1])
          local grace = tonumber(ARGV[4] or '0')
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
  end
  if not woken then
    redis.call(pub, ARGV[2], ARGV[1])
  end
end
return 1
