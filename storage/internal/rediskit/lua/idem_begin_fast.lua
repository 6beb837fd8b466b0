-- idem_begin.lua's common cases, first and with nothing else set up: a new
-- key, claimed in one call (SET NX GET, Redis 7.0+) with the server's
-- clock as its fence (see claim.lua), and a replay of a completed record.
-- When that does not decide, the rest of the script goes on from what it
-- found (fast_prev; nil when the fast path did not run).
local clock_read = nil
local fast_prev = nil
-- replay_pttl is the record's PTTL for a replay. With ARGV[4] '1' (the
-- caller waits for replicas after the script: WAIT) it also writes the
-- record's expiry again, unchanged: a write this connection's WAIT then
-- waits for, and with it the completion's, which another client wrote and
-- replication streams before it.
local function replay_pttl()
  local pttl = redis.call('PTTL', KEYS[1])
  if ARGV[4] == '1' and pttl > 0 then
    redis.call('PEXPIRE', KEYS[1], pttl)
  end
  return pttl
end
do
  local t = redis.call('TIME')
  clock_read = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
if redis.REDIS_VERSION_NUM then
  local f = string.format('%d', clock_read)
  fast_prev = redis.pcall('SET', KEYS[1], 'R2|i|' .. f .. '||' .. ARGV[2] .. '|' .. string.format('%d', #ARGV[1]) .. '|' .. ARGV[1],
    'NX', 'GET', 'PX', string.format('%d', tonumber(ARGV[3]) + 86400000)) -- the lease + attempt_memory
  if fast_prev == false then
    return {1, clock_read, clock_read}
  end
  -- A replay: a completed record with the caller's fingerprint.
  if type(fast_prev) == 'string' then
    local n, p = string.match(fast_prev, '^R2|c|%d+|%a*||(%d+)|()')
    if n and tonumber(n) == #ARGV[1] and string.sub(fast_prev, p, p + #ARGV[1] - 1) == ARGV[1] then
      return {3, replay_pttl(), string.sub(fast_prev, p + #ARGV[1])}
    end
  end
end
