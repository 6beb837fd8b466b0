-- Prepended to the scripts that issue fences (see scripts.go).
-- next_fence raises a fence counter to max(counter + 1, the server's clock
-- in microseconds) and returns it. The clock floor keeps fences going
-- forward when the counter is gone — a restart without persistence, a
-- failover to a replica that lacked it, the counter's own expiry — as long
-- as the server's clock does not step back past the last fence issued.
-- The counter lives life milliseconds after its last use (fence_life).
-- The counter moves by one per take (an acquisition, a grant, a transfer,
-- a claim): a server runs far fewer scripts per second on one key than
-- its clock counts microseconds, so the counter stays near the clock, and
-- a counter that is lost falls back to a clock floor above every fence it
-- issued. Drivers that hand a hold on locally scale these values
-- themselves (rediskit.Base.LeaseFence): the fences of local hand-offs
-- never pass through the counter.
-- reserve (optional, default 0) is what processes of earlier versions
-- passed: it kept the fences f + 1 .. f + reserve for the caller, stored as
-- "f:reserve", and every later fence is above f + reserve. No caller of
-- this version reserves (reservations, 129 fences per take, outran the
-- clock above a few thousand takes a second); counters of that form are
-- still read.
if redis.replicate_commands then redis.replicate_commands() end
-- clock_us is the server's clock in microseconds, read once per script:
-- every call inside a script costs the server a few microseconds.
local clock_read = nil
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
local function fence_life(ttl)
  return math.max(tonumber(ttl), 60000)
end
-- counter_parts reads a counter: the last fence issued and how many past
-- it were reserved.
local function counter_parts(v)
  if not v then
    return 0, 0
  end
  local f, r = string.match(v, '^(%d+):(%d+)$')
  if f then
    return tonumber(f), tonumber(r)
  end
  return tonumber(v) or 0, 0
end
-- fence_floor is the highest fence a counter has issued or reserved.
local function fence_floor(key)
  local f, r = counter_parts(redis.call('GET', key))
  return f + r
end
local function next_fence(key, life, reserve)
  local f = math.max(fence_floor(key) + 1, clock_us())
  reserve = tonumber(reserve) or 0
  local v = string.format('%d', f)
  if reserve > 0 then
    v = v .. ':' .. string.format('%d', reserve)
  end
  redis.call('SET', key, v, 'PX', fence_life(life))
  return f
end
-- raise_fence sets a counter to at least f, with reserve (optional) more
-- kept after it as next_fence does (Redlock's write-back).
local function raise_fence(key, f, life, reserve)
  reserve = tonumber(reserve) or 0
  if fence_floor(key) < tonumber(f) + reserve then
    local v = f
    if reserve > 0 then
      v = f .. ':' .. string.format('%d', reserve)
    end
    redis.call('SET', key, v, 'PX', fence_life(life))
  else
    redis.call('PEXPIRE', key, fence_life(life))
  end
end
