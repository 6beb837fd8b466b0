-- Completes or abandons an in-flight claim, or extends its lease, only
-- while the token still holds it.
-- KEYS[1] record
-- ARGV[1] token, ARGV[2] 'complete' | 'abandon' | 'extend',
-- ARGV[3] retention or lease in milliseconds, ARGV[4] result (complete),
-- ARGV[5] channel, ARGV[6] pub/sub mode ('s', 'c', 'a', 'n')
-- Returns 1 done, 0 not ours (the lease ran out, or another claim).
if not our_claim(KEYS[1], ARGV[1]) then
  return 0
end
if ARGV[2] == 'extend' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
if ARGV[2] == 'complete' then
  redis.call('HSET', KEYS[1], 's', 'c', 'r', ARGV[4], 't', '') -- no token once completed
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
local pub = publisher(ARGV[6])
if pub then
  redis.call(pub, ARGV[5], ARGV[2])
end
return 1
