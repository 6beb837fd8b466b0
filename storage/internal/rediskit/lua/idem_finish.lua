-- Completes or abandons an in-flight claim, or extends its lease, only
-- while the token still holds it (see claim.lua).
-- KEYS[1] record
-- ARGV[1] token, ARGV[2] 'complete' | 'abandon' | 'giveback' | 'extend',
-- ARGV[3] retention or lease in milliseconds, ARGV[4] result (complete),
-- ARGV[5] channel, ARGV[6] pub/sub mode ('s', 'c', 'a', 'n'),
-- ARGV[7] a fence the record keeps at least (Redlock: the claim's fence,
-- the highest of its nodes'), or '0', ARGV[8] '1' to refuse a claim past
-- its lease (rediskit.Base.StrictLeases).
-- Completion and abandonment are announced when a duplicate waits (flag
-- 'w'). An abandoned record becomes a tombstone that keeps its fence and
-- attempt number for attempt_memory (see claim.lua). A claim given back
-- (claimed for a caller that will never use it) is not an attempt: its
-- record keeps the attempts before it, or is deleted, or keeps only its
-- fence while the fence is ahead of the clock (see tombstone in
-- fence.lua).
-- Returns 1 done, 0 not ours (the lease ran out, or another claim).
local r = our_claim(KEYS[1], ARGV[1], ARGV[8] == '1')
if not r then
  return 0
end
if ARGV[2] == 'extend' then
  redis.call('PEXPIRE', KEYS[1], fmt(tonumber(ARGV[3]) + attempt_memory))
  return 1
end
local f = math.max(r.f, tonumber(ARGV[7]))
local gone = attempt_of(r) -- the attempts the tombstone remembers
if ARGV[2] == 'giveback' then
  gone = gone - 1 -- a claim nobody used: not an attempt
end
if ARGV[2] == 'complete' then
  redis.call('SET', KEYS[1], record_value('c', f, '', '', r.fp, ARGV[4]), 'PX', ARGV[3])
elseif gone >= 1 then
  redis.call('SET', KEYS[1], record_value('x', f, '', '', '', attempt_str(gone)), 'PX', attempt_memory)
elseif f >= clock_us() then
  redis.call('SET', KEYS[1], record_value('x', f, '', '', '', '0'), 'PX', tomb_life) -- no attempt: '0'
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
