-- release.lua's common case, first and with nothing else set up: the
-- caller's token holds the key with no flags (no owner, nobody queued),
-- and the key is deleted (or becomes a tombstone: see tombstone in
-- fence.lua) in one or two more calls. When that does not decide, the rest of
-- the script goes on from the value read (fast_v).
local clock_read = nil
local fast_v = redis.call('GET', KEYS[1])
if not fast_v or string.sub(fast_v, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
  return 0 -- free, or another token's (tokens hold no '|')
end
if string.byte(fast_v, -1) == 124 then -- ends with '|': no flags
  local f = math.max(tonumber(string.sub(fast_v, #ARGV[1] + 2, -2)) or 0, tonumber(ARGV[2]))
  -- The clock is read only when the fence may be ahead of it: not for an
  -- unfenced key (0), nor for a fence at or below ARGV[3], a reading of
  -- this server's clock the caller was given when its fence was issued
  -- (the clock has moved on since).
  local ahead = f > tonumber(ARGV[3])
  if ahead then
    local t = redis.call('TIME')
    ahead = f >= tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  if ahead then
    redis.call('SET', KEYS[1], '~|' .. string.format('%d', f) .. '|', 'PX', 60000)
  else
    redis.call('DEL', KEYS[1])
  end
  return 1
end
