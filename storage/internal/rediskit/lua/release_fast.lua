-- release.lua's common case, first and with nothing else set up: the
-- caller's token holds the key with no flags (no owner, nobody queued),
-- and the key is deleted (or becomes a tombstone: see tombstone in
-- fence.lua) in one or two more calls. When that does not decide, the rest of
-- the script goes on from the value read (fast_v).
local clock_read = nil
local fast_v = redis.call('GET', KEYS[1])
if not fast_v or string.sub(fast_v, 1, #ARGV[1] + 4) ~= 'L1|' .. ARGV[1] .. '|' then
  return 0 -- free, or another token's (tokens hold no '|'), or another layout's
end
if string.byte(fast_v, -1) == 124 then -- ends with '|': no flags
  local f = tonumber(string.sub(fast_v, #ARGV[1] + 5, -2)) or 0
  -- release_new.lua's ARGV[4]: the highest fence the token handed out.
  -- The take reserved fences above it (fence.lua's issue) for a hold
  -- passed on from lease to lease; a plain hold used none of them, so the
  -- key needs to keep only what was issued.
  if #KEYS == 1 and ARGV[4] and ARGV[4] ~= '0' then
    f = math.min(f, tonumber(ARGV[4]))
  end
  f = math.max(f, tonumber(ARGV[2]))
  -- ARGV[3] is a lower bound on this server's clock now (µs; 0: none),
  -- which the caller was given with its fence (and may have moved on by
  -- the time passed since). A fence at or below it is behind the clock:
  -- the key is deleted. A fence above it by less than a tombstone's life
  -- is kept in a tombstone that expires once the clock has passed it,
  -- with no clock read (Redis expires a key when its clock, in ms, is
  -- past the expiry: at least f here). Otherwise, or with no bound, the
  -- clock is read.
  local c = tonumber(ARGV[3])
  if f <= c then
    redis.call('DEL', KEYS[1])
    return 1
  end
  local px = 0
  if c > 0 and f - c < 59000000 then
    px = math.floor((f - c) / 1000) + 2
  else
    -- (as fence.lua's tombstone: until the clock has passed f, a
    -- tombstone's life at most)
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if f >= now then
      px = math.min(60000, math.floor((f - now) / 1000) + 2)
    end
  end
  if px > 0 then
    redis.call('SET', KEYS[1], 'L1|~|' .. string.format('%d', f) .. '|', 'PX', px)
  else
    redis.call('DEL', KEYS[1])
  end
  return 1
end
