-- Reads an idempotency record's state, for a duplicate deciding whether to
-- wait for it. Read-only.
-- KEYS[1] record (see idem_begin.lua)
-- Returns 'i' in flight, 'c' completed, '' absent or not a record.
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return ''
end
return redis.call('HGET', KEYS[1], 's') or ''
