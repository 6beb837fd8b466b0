-- acquire.lua's common case, first and with nothing else set up: a caller
-- with no owner, outside the queue, takes a key nobody holds or held
-- lately in one call (SET NX GET, Redis 7.0+). When that does not decide,
-- the rest of the script (fence.lua, acquire.lua) goes on from what it
-- found (fast_prev; nil when the fast path did not run). acquire_new.lua
-- runs it with one key and four arguments (#KEYS == 1).
local clock_read = nil
local fast_prev = nil
if (#KEYS == 1 or (ARGV[5] == '' and ARGV[6] == '')) and redis.REDIS_VERSION_NUM then
  local first = 0
  if ARGV[4] ~= '0' or ARGV[3] ~= '0' then
    local t = redis.call('TIME')
    clock_read = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if ARGV[3] ~= '0' and math.floor(clock_read / 1000) > tonumber(ARGV[3]) then
      return {-1, 0}
    end
    if ARGV[4] ~= '0' then
      first = clock_read
    end
  end
  -- A fenced take of a free key reserves 128 fences (see issue in
  -- fence.lua): the key keeps the last.
  local last = first
  if first > 0 then last = first + 127 end
  fast_prev = redis.call('SET', KEYS[1], 'L1|' .. ARGV[1] .. '|' .. string.format('%d', last) .. '|', 'NX', 'GET', 'PX', ARGV[2])
  if not fast_prev then
    return {1, first, first, last - first + 1}
  end
end
