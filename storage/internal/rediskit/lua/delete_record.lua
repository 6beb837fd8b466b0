-- Deletes an idempotency record, whatever its state (an operator's
-- action), and announces it on the record's channel so that waiting
-- duplicates look again.
-- KEYS[1] record, ARGV[1] channel, ARGV[2] pub/sub mode ('s', 'c', 'a', 'n')
-- Returns 1 when a record was deleted, 0 when there was none.
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
local pub = publisher(ARGV[2])
if pub then
  redis.call(pub, ARGV[1], 'delete')
end
return 1
