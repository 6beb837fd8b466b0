-- Prepended to the scripts that read or write a lock key or a record (see
-- scripts.go), after head.lua or the script's fast path.
--
-- A lock key holds one string:
--   "<token>|<fence>|<flags>"  held by token, with the key's last fence;
--   "~|<fence>|<flags>"        free (a tombstone): released while its
--                              fence ran ahead of the clock, or with a
--                              flag to keep; for tomb_life milliseconds;
-- flags: 'o' an owner hash records an owner's holds (reentrancy); 'w' a
-- process joined the key's waiting queue (a release looks at the queue
-- only then). The fence lives in the key itself: a new key costs one
-- write, a release one delete, and no second key is kept per lock.
--
-- Fences. A take issues max(last fence + 1, the server's clock in µs).
-- The clock floor keeps fences going forward where the last fence is gone
-- — a new key, a tombstone that lived out its life, a holder's key that
-- expired, a restart without persistence — as long as the server's clock
-- does not step back: a server runs far fewer scripts per second on one
-- key than its clock counts microseconds, so every fence issued is at most
-- the clock when it was issued, and the clock has moved on by the time the
-- key can be taken again (a key that expired did so a TTL later).
-- Drivers that hand a hold on locally scale these values themselves
-- (rediskit.Base.LeaseFence): the fences of local hand-offs never pass
-- through Redis.
-- (Scripts are replicated by their effects, the default from Redis 5.0,
-- so a write may follow TIME.)
-- clock_us is the server's clock in microseconds, read once per script:
-- every call inside a script costs the server a few microseconds. The
-- script declares clock_read before this file (head.lua, or its fast path,
-- which may have read the clock already).
local function clock_us()
  if not clock_read then
    local t = redis.call('TIME')
    clock_read = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock_read
end
local function clock_ms()
  return math.floor(clock_us() / 1000)
end
local function fmt(n)
  return string.format('%d', n)
end
-- How long a tombstone keeps a released key's last fence.
local tomb_life = 60000
local function has(flags, c)
  return string.find(flags, c, 1, true) ~= nil
end
-- lock_parse reads a lock key's value: the holder's token (nil when free),
-- the last fence, the flags. A value of another form is a holder's token
-- with fence 0 (nothing of ours writes one).
local function lock_parse(v)
  if not v then
    return nil, 0, ''
  end
  local t, f, fl = string.match(v, '^([^|]+)|(%d+)|(%a*)$')
  if not t then
    return v, 0, ''
  end
  if t == '~' then
    return nil, tonumber(f), fl
  end
  return t, tonumber(f), fl
end
local function lock_value(tok, f, flags)
  return tok .. '|' .. fmt(f) .. '|' .. flags
end
local function next_fence(last)
  return math.max(last + 1, clock_us())
end
-- set_nx_get sets key to v for px ms unless it exists, and returns what it
-- found (false: it was set). One call from Redis 7.0 (SET NX GET).
local function set_nx_get(key, v, px)
  if redis.REDIS_VERSION_NUM then
    return redis.call('SET', key, v, 'NX', 'GET', 'PX', px)
  end
  local old = redis.call('GET', key)
  if not old then
    redis.call('SET', key, v, 'PX', px)
  end
  return old
end
-- reserved_for returns the milliseconds left of a woken first waiter's
-- grace (see release.lua) when a free key is reserved for another member
-- of its waiting queue q (expiries qx) than member.
-- head, when given, is the queue's first members as ZRANGE q 0 n read
-- them (acquire.lua reads two: it also tells whether others remain).
local function reserved_for(q, qx, member, grace, head)
  if grace <= 0 then
    return 0
  end
  if not head then
    head = redis.call('ZRANGE', q, 0, 0)
  end
  if #head == 0 or head[1] == member then
    return 0
  end
  local exp = tonumber(redis.call('HGET', qx, head[1]) or '0')
  local now = clock_ms()
  if exp > now and exp <= now + grace then
    return exp - now
  end
  return 0
end
-- waiters_flag is 'w' while the key's waiting queue q has members, else ''.
local function waiters_flag(q)
  if redis.call('EXISTS', q) == 1 then
    return 'w'
  end
  return ''
end
-- tombstone frees key. It leaves a tombstone while flags must be kept (a
-- process still queued: the next holder's release must look at the queue,
-- fenced or not) or the last fence f is ahead of the clock (a fence issued
-- as last + 1 beyond the clock, or a Redlock floor from a node whose clock
-- is ahead). Otherwise — the common case — the key is deleted, and the
-- keyspace holds nothing for a released key: any later take issues at
-- least the clock, which is then above f.
local function tombstone(key, f, flags)
  if flags ~= '' or (f > 0 and f >= clock_us()) then
    redis.call('SET', key, lock_value('~', f, flags), 'PX', tomb_life)
  else
    redis.call('DEL', key)
  end
end
