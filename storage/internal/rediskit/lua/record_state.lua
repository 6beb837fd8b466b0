-- Reads an idempotency record's state for a duplicate that is about to
-- wait for it, after subscribing to its channel (see claim.lua): an
-- in-flight record is flagged 'w', so that its completion or abandonment
-- is announced.
-- KEYS[1] record
-- Returns 'i' in flight, 'c' completed, '' absent, abandoned, past its
-- lease or not a record.
local v = record_read(KEYS[1])
if type(v) ~= 'string' then
  return ''
end
local r = record_parse(v)
if not r then
  return ''
end
if r.s == 'i' and redis.call('PTTL', KEYS[1]) > attempt_memory then
  if not has(r.fl, 'w') then
    redis.call('SET', KEYS[1], record_value('i', r.f, r.fl .. 'w', r.t, r.fp, r.r), 'KEEPTTL')
  end
  return 'i'
end
if r.s == 'c' then
  return 'c'
end
return ''
