-- Prepended to the scripts that issue fences (see scripts.go).
-- next_fence raises a fence counter to max(counter + 1, the server's clock
-- in microseconds) and returns it. The clock floor keeps fences going
-- forward when the counter is gone — a restart without persistence, a
-- failover to a replica that lacked it, the counter's own expiry — as long
-- as the server's clock does not step back past the last fence issued.
-- The counter lives life milliseconds after its last use (fence_life).
if redis.replicate_commands then redis.replicate_commands() end
local function fence_life(ttl)
  return math.max(tonumber(ttl), 60000)
end
local function next_fence(key, life)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local f = math.max(tonumber(redis.call('GET', key) or '0') + 1, now)
  redis.call('SET', key, string.format('%d', f), 'PX', fence_life(life))
  return f
end
-- raise_fence sets a counter to at least f (Redlock's write-back).
local function raise_fence(key, f, life)
  if tonumber(redis.call('GET', key) or '0') < tonumber(f) then
    redis.call('SET', key, f, 'PX', fence_life(life))
  else
    redis.call('PEXPIRE', key, fence_life(life))
  end
end

