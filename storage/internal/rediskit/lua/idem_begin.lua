-- Claims an idempotency key, or reports its record.
-- KEYS[1] record (hash), KEYS[2] fence counter (same hash tag)
-- ARGV[1] fingerprint, ARGV[2] token, ARGV[3] lease in milliseconds
-- The record is a hash {v = 1, s = 'i' (in flight) | 'c' (completed),
-- fp, t = token (in flight; empty once completed), f = fence,
-- r = result (completed)} whose PTTL is the lease or the retention.
-- Returns {1, fence} claimed; {2, pttl} in flight; {3, pttl, result}
-- completed; {4, pttl} another fingerprint; {-2, reason} not our record.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  local f = next_fence(KEYS[2], ARGV[3])
  redis.call('HSET', KEYS[1], 'v', '1', 's', 'i', 'fp', ARGV[1], 't', ARGV[2], 'f', string.format('%d', f))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, f}
end
if kind ~= 'hash' then
  return {-2, 'a ' .. kind .. ', not a record'}
end
local r = redis.call('HMGET', KEYS[1], 'v', 's', 'fp', 'r')
if r[1] ~= '1' then
  return {-2, 'record version ' .. tostring(r[1])}
end
local pttl = redis.call('PTTL', KEYS[1])
if r[3] ~= ARGV[1] then
  return {4, pttl}
end
if r[2] == 'i' then
  return {2, pttl}
end
if r[2] == 'c' and r[4] then
  return {3, pttl, r[4]}
end
return {-2, 'record state ' .. tostring(r[2])}
