-- Completes or abandons an in-flight claim, or extends its lease, only
-- while the token still holds it (see claim.lua).
-- KEYS[1] record
-- ARGV[1] token, ARGV[2] 'complete' | 'abandon' | 'extend',
-- ARGV[3] retention or lease in milliseconds, ARGV[4] result (complete),
-- ARGV[5] channel, ARGV[6] pub/sub mode ('s', 'c', 'a', 'n'),
-- ARGV[7] a fence the record keeps at least (Redlock: the claim's fence,
-- the highest of its nodes'), or '0'.
-- Completion and abandonment are announced when a duplicate waits (flag
-- 'w'). An abandoned record is deleted, or becomes a tombstone that keeps
-- its fence while the fence is ahead of the clock (see tombstone in
-- fence.lua).
-- Returns 1 done, 0 not ours (the lease ran out, or another claim).
local r = our_claim(KEYS[1], ARGV[1])
if not r then
  return 0
end
if ARGV[2] == 'extend' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
local f = math.max(r.f, tonumber(ARGV[7]))
if ARGV[2] == 'complete' then
  redis.call('SET', KEYS[1], record_value('c', f, '', '', r.fp, ARGV[4]), 'PX', ARGV[3])
elseif f >= clock_us() then
  redis.call('SET', KEYS[1], record_value('x', f, '', '', '', ''), 'PX', tomb_life)
else
  redis.call('DEL', KEYS[1])
end
if has(r.fl, 'w') then
  local pub = publisher(ARGV[6])
  if pub then
    redis.call(pub, ARGV[5], ARGV[2])
  end
end
return 1
