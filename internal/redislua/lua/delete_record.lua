-- Deletes an idempotency record, whatever its state (an operator's
-- action), and announces it on the record's channel so that waiting
-- duplicates look again.
-- KEYS[1] record, ARGV[1] channel, ARGV[2] pub/sub mode ('s', 'c', 'a', 'n')
-- Returns 1 when a record was deleted, 0 when there was none.
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
local mode = ARGV[2]
if mode == 'a' then
  local v = redis.REDIS_VERSION_NUM
  if v and v >= 0x070000 then mode = 's' else mode = 'c' end
end
if mode == 's' then
  redis.call('SPUBLISH', ARGV[1], 'delete')
elseif mode == 'c' then
  redis.call('PUBLISH', ARGV[1], 'delete')
end
return 1
