-- A first attempt at a key, by a caller with no owner and outside the
-- queue: acquire_fast.lua, then this, with KEYS[1] the lock key and ARGV[1]
-- token, ARGV[2] TTL in milliseconds, ARGV[3] the caller's deadline in
-- Unix milliseconds or 0, ARGV[4] "0" for no fence (acquire.lua's
-- ARGV[1..4]). It is acquire.lua for such a caller, sent with one key and
-- four arguments instead of four and ten: every key and argument costs the
-- client and the server work on the path of every new key (each declared
-- key measurably so on the server). It answers as acquire.lua does — taken
-- {1, fence, clock}, held {0, PTTL, floor} (with a fourth element, 1, when
-- processes wait in the key's queue), too late {-1, 0} — or {-2}
-- when only acquire.lua can decide: a key whose tombstone says a process
-- is queued (a release may have reserved it for the waiter it woke, and a
-- take must carry the flag on), the caller's own token (Redlock re-asking a
-- node), a server before Redis 7.0.
if fast_prev == nil then
  return {-2}
end
local tok, f, flags = lock_parse(fast_prev)
if tok == ARGV[1] then
  return {-2}
end
if tok then
  if has(flags, 'w') then
    return {0, redis.call('PTTL', KEYS[1]), f, 1}
  end
  return {0, redis.call('PTTL', KEYS[1]), f}
end
if flags ~= '' then
  return {-2}
end
-- A tombstone with no flags: free, with its last fence.
local nf, last, clock = 0, 0, 0
if ARGV[4] ~= '0' then
  nf, last = issue(f)
  clock = clock_us()
end
redis.call('SET', KEYS[1], lock_value(ARGV[1], last, ''), 'PX', ARGV[2])
return {1, nf, clock, last - nf + 1}
