-- Prepended to the scripts that read or write a lock key or a record (see
-- scripts.go), after head.lua or the script's fast path.
--
-- A lock key holds one string, of layout L1 (oncekit v0.1.0's):
--   "L1|<token>|<fence>|<flags>"  held by token, with the key's last fence;
--   "L1|~|<fence>|<flags>"        free (a tombstone): released while its
--                                 fence ran ahead of the clock, or with a
--                                 flag to keep; for tomb_life milliseconds;
-- A value of any other form (another layout's "L<n>|…") is held by
-- someone this version does not know, with fence 0: never taken over nor
-- rewritten, it frees when its PTTL runs out.
-- flags: 'o' an owner hash records an owner's holds (reentrancy); 'w' a
-- process joined the key's waiting queue (a release looks at the queue
-- only then). The fence lives in the key itself: a new key costs one
-- write, a release one delete, and no second key is kept per lock.
--
-- Fences. A take of a lock issues the fences start .. last of a hold:
-- start = max(last fence + 1, the server's clock in µs), and up to
-- hold_fences of them, never reaching more than hold_fences − 1 µs past
-- the clock (issue). The key keeps the last of them; the hold's leases
-- take start, start + 1, … (local hand-offs, with no round trip), so
-- every later take issues above all of them. The clock floor keeps
-- fences going forward where the last fence is gone — a new key, a
-- tombstone that lived out its life, a holder's key that expired, a
-- restart without persistence — as long as the server's clock does not
-- step back: a server runs far fewer scripts per second on one key than
-- its clock counts microseconds, and a take reserves ahead of the clock
-- by less than hold_fences µs, so every fence issued is at most a moment
-- past the clock when it was issued, and the clock has moved on by the
-- time the key can be taken again (a key that expired did so a TTL
-- later). Fences stay near the clock in µs (about 2^51 today), below 2^53:
-- a script (Lua numbers are doubles), JSON or JavaScript compares them
-- exactly. Claims (records) issue one fence each (next_fence).
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
-- with fence 0 (another layout's, or nothing of ours).
local function lock_parse(v)
  if not v then
    return nil, 0, ''
  end
  local t, f, fl = string.match(v, '^L1|([^|]+)|(%d+)|(%a*)$')
  if not t then
    return v, 0, ''
  end
  if t == '~' then
    return nil, tonumber(f), fl
  end
  return t, tonumber(f), fl
end
local function lock_value(tok, f, flags)
  return 'L1|' .. tok .. '|' .. fmt(f) .. '|' .. flags
end
local function next_fence(last)
  return math.max(last + 1, clock_us())
end
-- How many fences one take of a lock reserves at most (rediskit.HoldFences).
local hold_fences = 128
-- issue returns the first and the last fence of a take of a lock key whose
-- last fence was last: the key keeps the last.
local function issue(last)
  local c = clock_us()
  local start = math.max(last + 1, c)
  return start, math.max(start, c + hold_fences - 1)
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
  if flags ~= '' then
    redis.call('SET', key, lock_value('~', f, flags), 'PX', tomb_life)
  elseif f > 0 and f >= clock_us() then
    -- Kept until the clock has passed f (Redis expires a key once its
    -- clock, in ms, is past the expiry).
    local px = math.min(tomb_life, math.floor((f - clock_us()) / 1000) + 2)
    redis.call('SET', key, lock_value('~', f, flags), 'PX', px)
  else
    redis.call('DEL', key)
  end
end
