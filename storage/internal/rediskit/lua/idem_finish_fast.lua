-- idem_finish.lua's common case, first and with nothing else set up: the
-- caller's in-flight claim, its first attempt, with no flags (nobody waits
-- for it), is completed, abandoned, given back or extended in a few more
-- calls. When that does not
-- decide, the rest of the script goes on as if this had not run.
local clock_read = nil
do
  local v = redis.pcall('GET', KEYS[1])
  if type(v) ~= 'string' then
    return 0 -- no record (or not a string): not ours
  end
  local f, q = string.match(v, '^R2|i|(%d+)||()')
  if f and string.sub(v, q, q + #ARGV[1]) == ARGV[1] .. '|' then
    -- "<fingerprint length>|<fingerprint>" and nothing after it
    local rest = q + #ARGV[1] + 1
    local n, p = string.match(v, '^(%d+)|()', rest)
    if n and p + tonumber(n) == #v + 1 then
      -- (an attempt 1: nothing after the fingerprint)
      if ARGV[8] == '1' and redis.call('PTTL', KEYS[1]) <= 86400000 then
        return 0 -- strict: its lease ran out (the PTTL is the lease + attempt_memory)
      end
      if ARGV[2] == 'extend' then
        redis.call('PEXPIRE', KEYS[1], string.format('%d', tonumber(ARGV[3]) + 86400000))
        return 1
      end
      local fn = tonumber(f)
      if ARGV[7] ~= '0' then
        fn = math.max(fn, tonumber(ARGV[7]))
        f = string.format('%d', fn)
      end
      if ARGV[2] == 'complete' then
        redis.call('SET', KEYS[1], 'R2|c|' .. f .. '|||' .. string.sub(v, rest) .. ARGV[4], 'PX', ARGV[3])
        return 1
      end
      if ARGV[2] == 'abandon' then
        -- A tombstone of attempt 1, for the next claim's attempt.
        redis.call('SET', KEYS[1], 'R2|x|' .. f .. '|||0|', 'PX', 86400000)
        return 1
      end
      -- giveback: a claim nobody used, the first: nothing to remember
      local t = redis.call('TIME')
      if fn >= tonumber(t[1]) * 1000000 + tonumber(t[2]) then
        redis.call('SET', KEYS[1], 'R2|x|' .. f .. '|||0|0', 'PX', 60000) -- attempt '0': none
      else
        redis.call('DEL', KEYS[1])
      end
      return 1
    end
  end
end
