-- A first attempt at a key, by a caller with no owner and outside the
-- queue: acquire_fast.lua, then this, with KEYS[1] the lock key, KEYS[2]
-- its waiting queue, KEYS[3] the queue's expiries, and ARGV[1] token,
-- ARGV[2] TTL in milliseconds, ARGV[3] the caller's deadline in Unix
-- milliseconds or 0, ARGV[4] "0" for no fence, ARGV[5] the wake grace in
-- milliseconds (acquire.lua's ARGV[1..4] and ARGV[9]). It is acquire.lua
-- for such a caller, sent with three keys and five arguments instead of
-- four and ten: every argument costs the client and the server work on
-- the path of every new key. It answers as acquire.lua does — taken
-- {1, fence, clock} (with a fourth element when the key it took carries
-- the queue's flag, so that its release goes to release.lua at once),
-- held {0, PTTL, floor}, reserved for a woken waiter {0, grace left,
-- floor}, too late {-1, 0} — or {-2} when only acquire.lua can decide:
-- the caller's own token (Redlock re-asking a node), a server before
-- Redis 7.0.
if fast_prev == nil then
  return {-2}
end
local tok, f, flags = lock_parse(fast_prev)
if tok == ARGV[1] then
  return {-2}
end
if tok then
  return {0, redis.call('PTTL', KEYS[1]), f}
end
-- A tombstone: free, with its last fence, unless a release just woke the
-- first queued process for it.
local fl = ''
if has(flags, 'w') then
  local reserved = reserved_for(KEYS[2], KEYS[3], '', tonumber(ARGV[5]))
  if reserved > 0 then
    return {0, reserved, f}
  end
  fl = waiters_flag(KEYS[2])
end
local nf, clock = 0, 0
if ARGV[4] ~= '0' then
  nf = next_fence(f)
  clock = clock_us()
end
redis.call('SET', KEYS[1], lock_value(ARGV[1], nf, fl), 'PX', ARGV[2])
if fl ~= '' then
  return {1, nf, clock, fl}
end
return {1, nf, clock}
